package lifecycle_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/triagehq/triage/lifecycle"
)

// A task starts in lame duck while it warms up, serves once Ready, and on
// SIGTERM enters lame duck again: its load balancers and clients stop
// sending new work during the drain, and only then is the server stopped.
// triagegrpc.NewLifecycle and triagehttp.HealthHandler announce the state;
// here a subscriber prints it.
func Example() {
	lc, err := lifecycle.New(lifecycle.WithWarmup(), lifecycle.WithDrain(10*time.Millisecond)) // default drain 30 s
	if err != nil {
		log.Fatal(err)
	}
	stop := lc.Subscribe(func(lame bool) { fmt.Println("lame duck:", lame) })
	defer stop()

	lc.Ready() // caches filled, connections made
	err = lc.Shutdown(context.Background(), func(context.Context) error {
		fmt.Println("stopping the server") // triagegrpc.GracefulStop(s) or triagehttp.Shutdown(srv)
		return nil
	})
	fmt.Println(err)
	// Output:
	// lame duck: true
	// lame duck: false
	// lame duck: true
	// stopping the server
	// <nil>
}
