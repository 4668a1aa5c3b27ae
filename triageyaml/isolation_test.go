package triageyaml_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/triageyaml"
)

const goodIsolation = `
clients:
  - name: maps
    hosts: [maps.api.example.com]
  - name: rogue
    hosts: [rogue.api.example.com]
    route: sacrificial
sacrificial: ["10.0.0.7:8080"]
`

// The operator edits the file: the rogue is black-holed at the next
// check, without a restart; a bad edit is refused and the table keeps the
// last good config.
func TestWatchIsolation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "isolation.yaml")
	if err := os.WriteFile(path, []byte(goodIsolation), 0o600); err != nil {
		t.Fatal(err)
	}
	tb, err := isolate.New(isolate.Config{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := triageyaml.WatchIsolation(path, tb, triageyaml.WithWatchClock(clock.NewFake(time.Unix(0, 0))))
	if err != nil {
		t.Fatal(err)
	}
	if tb.RouteOf(tb.ClientFor("rogue.api.example.com")) != isolate.Sacrificial || !tb.IsSacrificial("10.0.0.7:8080") {
		t.Fatalf("initial file not in force: %+v", tb.Config())
	}
	os.WriteFile(path, []byte(strings.Replace(goodIsolation, "route: sacrificial", "route: black-hole", 1)), 0o600)
	if ok, err := w.Check(); !ok || err != nil {
		t.Fatalf("reload: %v, %v", ok, err)
	}
	if tb.RouteOf("rogue") != isolate.BlackHole {
		t.Fatal("the black-hole edit was not applied")
	}
	os.WriteFile(path, []byte(strings.Replace(goodIsolation, "route: sacrificial", "route: sacrifical", 1)), 0o600)
	if ok, err := w.Check(); ok || err == nil {
		t.Fatal("a misspelt route was accepted")
	}
	if tb.RouteOf("rogue") != isolate.BlackHole {
		t.Fatal("a refused file changed the table")
	}
	if _, err := triageyaml.WatchIsolation(filepath.Join(t.TempDir(), "missing.yaml"), tb); err == nil {
		t.Fatal("a missing initial file was accepted")
	}
}

func TestParseIsolationErrors(t *testing.T) {
	for name, in := range map[string]string{
		"unknown field": "clients: []\nsacrifical: []\n",
		"bad host":      "clients:\n  - name: a\n    hosts: [\"*.x\"]\n",
		"no hosts":      "clients:\n  - name: a\n",
		"wrong type":    "clients: yes\n",
	} {
		if _, err := triageyaml.ParseIsolation([]byte(in)); err == nil || !strings.HasPrefix(err.Error(), "triageyaml: ") {
			t.Errorf("%s: err %v", name, err)
		}
	}
}

// FuzzParseIsolation: whatever the bytes, no panic; an accepted config
// builds a Table whose lookups answer for every host it names.
func FuzzParseIsolation(f *testing.F) {
	f.Add([]byte(goodIsolation))
	f.Add([]byte("clients: [{name: a, hosts: [A.example.]}]\n"))
	f.Add([]byte("clients: [{name: a, hosts: [x], route: black-hole}, {name: b, hosts: [x]}]\n"))
	f.Add([]byte("sacrificial: [\"[::1]:80\", \"\"]\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := triageyaml.ParseIsolation(b)
		if err != nil {
			return
		}
		tb, err := isolate.New(c)
		if err != nil {
			t.Fatalf("ParseIsolation accepted what New refuses: %v", err)
		}
		for _, cl := range c.Clients {
			for _, h := range cl.Hosts {
				if got := tb.ClientFor(h); got != cl.Name {
					t.Fatalf("host %q: client %q, want %q", h, got, cl.Name)
				}
			}
		}
	})
}
