package isolate_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/triagehq/triage/isolate"
)

func table(t testing.TB) *isolate.Table {
	t.Helper()
	tb, err := isolate.New(isolate.Config{
		Clients: []isolate.Client{
			{Name: "maps", Hosts: []string{"maps.api.example.com", "maps-eu.api.example.com"}},
			{Name: "rogue", Hosts: []string{"rogue.api.example.com"}, Route: "sacrificial"},
			{Name: "spam", Hosts: []string{"spam.api.example.com"}, Route: "black-hole"},
		},
		Sacrificial: []string{"10.0.0.7:8080"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

func TestLookups(t *testing.T) {
	tb := table(t)
	for host, want := range map[string]string{
		"maps.api.example.com":        "maps",
		"MAPS-EU.api.example.com:443": "maps",
		"rogue.api.example.com.":      "rogue",
		"api.example.com":             "",
		"x.maps.api.example.com":      "",
		"":                            "",
	} {
		if got := tb.ClientFor(host); got != want {
			t.Errorf("ClientFor(%q) = %q, want %q", host, got, want)
		}
	}
	for client, want := range map[string]isolate.Route{"maps": isolate.Shared, "rogue": isolate.Sacrificial, "spam": isolate.BlackHole, "": isolate.Shared, "unknown": isolate.Shared} {
		if got := tb.RouteOf(client); got != want {
			t.Errorf("RouteOf(%q) = %v, want %v", client, got, want)
		}
	}
	if !tb.IsSacrificial("10.0.0.7:8080") || tb.IsSacrificial("10.0.0.8:8080") {
		t.Error("IsSacrificial wrong")
	}
	ctx := isolate.NewContext(context.Background(), "maps")
	if isolate.ClientOf(ctx) != "maps" || isolate.ClientOf(context.Background()) != "" {
		t.Error("context plumbing wrong")
	}
}

// A bad config is refused as a whole and the table keeps what it had;
// subscribers hear of every config put in force, not of refusals.
func TestSetAtRuntime(t *testing.T) {
	tb := table(t)
	heard := 0
	unsub := tb.Subscribe(func() { heard++ })
	v := tb.Version()
	c := tb.Config()
	c.Clients[0].Route = "black-hole"
	if err := tb.Set(c); err != nil {
		t.Fatal(err)
	}
	if tb.RouteOf("maps") != isolate.BlackHole || tb.Version() != v+1 || heard != 1 {
		t.Fatalf("after Set: route %v, version %d (was %d), heard %d", tb.RouteOf("maps"), tb.Version(), v, heard)
	}
	c.Clients[0].Route = "nowhere"
	if err := tb.Set(c); !errors.Is(err, isolate.ErrConfig) {
		t.Fatalf("bad route: %v", err)
	}
	if tb.RouteOf("maps") != isolate.BlackHole || heard != 1 {
		t.Fatal("a refused config changed the table or was announced")
	}
	unsub()
	c.Clients[0].Route = ""
	tb.Set(c)
	if heard != 1 || tb.RouteOf("maps") != isolate.Shared {
		t.Fatalf("after unsubscribing: heard %d, route %v", heard, tb.RouteOf("maps"))
	}
}

func TestBadConfigs(t *testing.T) {
	many := func(n int, f func(i int) isolate.Client) []isolate.Client {
		out := make([]isolate.Client, n)
		for i := range out {
			out[i] = f(i)
		}
		return out
	}
	for name, c := range map[string]isolate.Config{
		"empty name":      {Clients: []isolate.Client{{Hosts: []string{"a.example"}}}},
		"bad name":        {Clients: []isolate.Client{{Name: "a b", Hosts: []string{"a.example"}}}},
		"long name":       {Clients: []isolate.Client{{Name: strings.Repeat("a", 65), Hosts: []string{"a.example"}}}},
		"named twice":     {Clients: []isolate.Client{{Name: "a", Hosts: []string{"a.example"}}, {Name: "a", Hosts: []string{"b.example"}}}},
		"no hosts":        {Clients: []isolate.Client{{Name: "a"}}},
		"host twice":      {Clients: []isolate.Client{{Name: "a", Hosts: []string{"x.example"}}, {Name: "b", Hosts: []string{"X.example"}}}},
		"host with port":  {Clients: []isolate.Client{{Name: "a", Hosts: []string{"x.example:443"}}}},
		"wildcard":        {Clients: []isolate.Client{{Name: "a", Hosts: []string{"*.example"}}}},
		"unknown route":   {Clients: []isolate.Client{{Name: "a", Hosts: []string{"x.example"}, Route: "Sacrificial"}}},
		"bad sacrificial": {Sacrificial: []string{""}},
		"too many clients": {Clients: many(isolate.MaxClients+1, func(i int) isolate.Client {
			return isolate.Client{Name: fmt.Sprint("c", i), Hosts: []string{fmt.Sprint("h", i)}}
		})},
		"too many hosts": {Clients: many(3, func(i int) isolate.Client { return isolate.Client{Name: fmt.Sprint("c", i), Hosts: hosts(i, 2000)} })},
	} {
		if _, err := isolate.New(c); !errors.Is(err, isolate.ErrConfig) {
			t.Errorf("%s: err %v", name, err)
		}
	}
}

func hosts(c, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("h%d-%d.example", c, i)
	}
	return out
}

func TestRouteNames(t *testing.T) {
	for _, r := range []isolate.Route{isolate.Shared, isolate.Sacrificial, isolate.BlackHole} {
		if got, err := isolate.ParseRoute(r.String()); err != nil || got != r {
			t.Errorf("ParseRoute(%q) = %v, %v", r.String(), got, err)
		}
	}
}

func TestLookupsDoNotAllocate(t *testing.T) {
	tb := table(t)
	if n := testing.AllocsPerRun(100, func() {
		_ = tb.RouteOf(tb.ClientFor("maps.api.example.com:443"))
		_ = tb.IsSacrificial("10.0.0.7:8080")
	}); n != 0 {
		t.Errorf("%v allocations per lookup", n)
	}
}
