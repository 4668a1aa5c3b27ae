package isolate_test

import (
	"fmt"

	"github.com/triagehq/triage/isolate"
)

// Each client type reaches the service through its own hostname. When one
// misbehaves, the operator moves it to the sacrificial backends at
// runtime, and black-holes it if need be; the other client types never
// reach the sacrificial backends.
func Example() {
	t, err := isolate.New(isolate.Config{
		Clients: []isolate.Client{
			{Name: "maps", Hosts: []string{"maps.api.example.com"}},
			{Name: "photos", Hosts: []string{"photos.api.example.com"}},
		},
		Sacrificial: []string{"10.0.0.7:8080"},
	})
	if err != nil {
		panic(err)
	}
	// triagehttp.WithIntake(intake.WithIsolation(t)) names the client type from the Host;
	// lb.WithIsolation(t) routes by it.
	photos := t.ClientFor("Photos.api.example.com:443")
	fmt.Println(photos, t.RouteOf(photos))

	c := t.Config()
	c.Clients[1].Route = "sacrificial"
	if err := t.Set(c); err != nil {
		panic(err)
	}
	fmt.Println(photos, t.RouteOf(photos), t.IsSacrificial("10.0.0.7:8080"))
	// Output:
	// photos shared
	// photos sacrificial true
}
