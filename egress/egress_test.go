package egress_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/wire"
)

func mustNew(t *testing.T, opts ...egress.Option) *egress.Caller {
	t.Helper()
	c, err := egress.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestNewRefusesBadInput(t *testing.T) {
	for name, opts := range map[string][]egress.Option{
		"nil option":       {nil},
		"empty host":       {egress.WithInternal("")},
		"a URL":            {egress.WithInternal("http://api.internal")},
		"a wildcard label": {egress.WithInternal("*.svc")},
		"a bare dot":       {egress.WithInternal(".")},
		"a space":          {egress.WithInternal("api internal")},
		"too many":         {egress.WithInternal(make([]string, egress.MaxHosts+1)...)},
	} {
		if c, err := egress.New(opts...); err == nil {
			c.Close()
			t.Errorf("%s: no error", name)
		}
	}
}

func TestInternalHosts(t *testing.T) {
	c := mustNew(t, egress.WithInternal("api.internal", ".svc.cluster.local", "10.0.0.7", "[::1]:8443"))
	for host, want := range map[string]bool{
		"api.internal":                true,
		"API.Internal.:443":           true,
		"api.internal.evil.example":   false,
		"pay.ns.svc.cluster.local":    true,
		"svc.cluster.local":           false, // the suffix names hosts under it
		"evilsvc.cluster.local":       false,
		"10.0.0.7:80":                 true,
		"10.0.0.70":                   false,
		"[::1]:9000":                  true,
		"":                            false,
		"example.com":                 false,
		"pay.ns.svc.cluster.local.:1": true,
	} {
		if got := c.Internal(host); got != want {
			t.Errorf("Internal(%q) = %v, want %v", host, got, want)
		}
	}
	if mustNew(t).Internal("api.internal") {
		t.Error("a Caller without WithInternal calls a host internal")
	}
	if !mustNew(t, egress.WithInternal("*")).Internal("anything.example") {
		t.Error(`"*" does not match every host`)
	}
}

func TestKeys(t *testing.T) {
	f := clock.NewFake(time.Unix(1000, 0))
	c := mustNew(t, egress.WithoutPolicy(), egress.WithInternal("api.internal"), egress.WithClock(f))
	ctx := criticality.NewContext(context.Background(), criticality.CriticalPlus)
	ctx = criticality.WithDecay(ctx, criticality.Decay{At: f.Now().Add(2 * time.Second), To: criticality.Sheddable})
	ctx = quota.NewContext(ctx, "acme")

	if external := c.Begin(ctx, "example.com"); func() bool { _, ok := external.Keys(ctx); return ok }() {
		t.Fatal("a call to an external host has keys")
	}
	call := c.Begin(ctx, "api.internal:443")
	defer call.End()
	k, ok := call.Keys(ctx)
	want := egress.Keys{Level: criticality.CriticalPlus, Decay: criticality.FormatDecay(criticality.Decay{At: f.Now().Add(2 * time.Second), To: criticality.Sheddable}, f.Now()), Customer: "acme"}
	if !ok || k != want {
		t.Fatalf("first try: %+v %v, want %+v", k, ok, want)
	}
	k, _ = call.Keys(attempt.NewOutgoingContext(ctx, 2))
	if k.Attempt != 2 {
		t.Fatalf("retry: attempt %d, want 2", k.Attempt)
	}
	f.Advance(2 * time.Second)
	if k, _ = call.Keys(ctx); k.Level != criticality.Sheddable || k.Decay != "" {
		t.Fatalf("after the decay: %+v, want SHEDDABLE and no decay", k)
	}
	long := quota.NewContext(ctx, strings.Repeat("a", 65))
	if k, _ = call.Keys(long); k.Customer != "" {
		t.Fatalf("an oversize customer is sent: %q", k.Customer)
	}
}

// Pairs is Keys' one wire form: the criticality always, the rest only
// when set, with wire's names.
func TestKeysPairs(t *testing.T) {
	for _, c := range []struct {
		k    egress.Keys
		want []string
	}{
		{egress.Keys{Level: criticality.Sheddable}, []string{wire.CriticalityKey, "SHEDDABLE"}},
		{egress.Keys{Level: criticality.Critical, Attempt: 2}, []string{wire.CriticalityKey, "CRITICAL", wire.AttemptKey, "2"}},
		{egress.Keys{Level: criticality.CriticalPlus, Attempt: 1, Decay: "1850:SHEDDABLE", Customer: "acme"},
			[]string{wire.CriticalityKey, "CRITICAL_PLUS", wire.AttemptKey, "1", wire.DecayKey, "1850:SHEDDABLE", wire.CustomerKey, "acme"}},
	} {
		if got := c.k.Pairs(nil); !slices.Equal(got, c.want) {
			t.Errorf("%+v.Pairs = %q, want %q", c.k, got, c.want)
		}
	}
	k := egress.Keys{Level: criticality.Critical, Attempt: 1, Decay: "10:SHEDDABLE", Customer: "acme"}
	buf := make([]string, 0, 8)
	if n := testing.AllocsPerRun(100, func() { _ = k.Pairs(buf[:0]) }); n != 0 {
		t.Errorf("Pairs with room allocates %v times", n)
	}
}

// A nil Caller begins calls without a policy to no internal host: the
// zero triagehttp.Transport's.
func TestNilCaller(t *testing.T) {
	var c *egress.Caller
	call := c.Begin(context.Background(), "api.internal")
	defer call.End()
	if _, ok := call.Keys(call.Context()); ok {
		t.Fatal("a nil Caller's call has keys")
	}
	n := 0
	err := call.Do(false, func(context.Context) error { n++; return outcome.New(outcome.TaskOverloaded, "x") })
	if n != 1 || err == nil {
		t.Fatalf("%d attempts, %v; want 1 and its error", n, err)
	}
	if s, err := call.Start(); err != nil {
		t.Fatal(err)
	} else {
		s.Finish(nil)
	}
}

func overloaded(n *int) func(context.Context) error {
	return func(ctx context.Context) error {
		*n++
		return outcome.New(outcome.TaskOverloaded, "busy")
	}
}

func TestDoOnceAndEveryAttempt(t *testing.T) {
	p, err := retry.New(retry.WithBackoff(0, 0), retry.WithoutThrottle(), retry.WithoutBudget())
	if err != nil {
		t.Fatal(err)
	}
	c := mustNew(t, egress.WithPolicy(p))
	var all, once int
	call := c.Begin(context.Background(), "")
	err = call.Do(false, overloaded(&all))
	if all != 3 || !errors.Is(err, outcome.ErrDontRetry) {
		t.Fatalf("Do: %d attempts, %v; want 3 and don't retry", all, err)
	}
	call.Do(true, overloaded(&once))
	if once != 1 {
		t.Fatalf("Do once: %d attempts", once)
	}
	call.End()
}

func isolation(t *testing.T, route string) *isolate.Table {
	t.Helper()
	iso, err := isolate.New(isolate.Config{Clients: []isolate.Client{{Name: "maps", Hosts: []string{"maps.example"}, Route: route}}})
	if err != nil {
		t.Fatal(err)
	}
	return iso
}

// A client type routed to the sacrificial backends runs under the
// sacrificial policy; the others under the Caller's.
func TestSacrificialPolicy(t *testing.T) {
	shared, _ := retry.New(retry.WithBackoff(0, 0), retry.WithoutThrottle(), retry.WithoutBudget())
	sac, _ := retry.New(retry.WithMaxAttempts(1), retry.WithoutThrottle(), retry.WithoutBudget())
	c := mustNew(t, egress.WithPolicy(shared), egress.WithIsolation(isolation(t, "sacrificial"), sac))
	var maps, other int
	ctx := isolate.NewContext(context.Background(), "maps")
	call := c.Begin(ctx, "")
	call.Do(false, overloaded(&maps))
	call.End()
	call = c.Begin(isolate.NewContext(context.Background(), "mail"), "")
	call.Do(false, overloaded(&other))
	call.End()
	if maps != 1 || other != 3 {
		t.Fatalf("attempts: maps (sacrificial) %d, mail (shared) %d; want 1 and 3", maps, other)
	}
}

// A route change cancels the calls in flight of the client type it
// moved, and only those; after Close it cancels nothing.
func TestRouteChangeCancelsCalls(t *testing.T) {
	iso := isolation(t, "shared")
	c := mustNew(t, egress.WithIsolation(iso, nil))
	maps := c.Begin(isolate.NewContext(context.Background(), "maps"), "")
	defer maps.End()
	mail := c.Begin(isolate.NewContext(context.Background(), "mail"), "")
	defer mail.End()
	plain := c.Begin(context.Background(), "")
	if plain.Context() != context.Background() {
		t.Fatal("a call without a client type got a context of its own")
	}
	if err := iso.Set(isolate.Config{Clients: []isolate.Client{{Name: "maps", Hosts: []string{"maps.example"}, Route: "sacrificial"}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-maps.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the moved client type's call was not cancelled")
	}
	if mail.Context().Err() != nil {
		t.Fatal("another client type's call was cancelled")
	}
	c.Close()
	later := c.Begin(isolate.NewContext(context.Background(), "maps"), "")
	defer later.End()
	iso.Set(isolate.Config{})
	if later.Context().Err() != nil {
		t.Fatal("a route change after Close cancelled a call")
	}
}

// Ending a call, or its caller's cancelling it, removes it from its
// client type's generation: 50,000 calls given up without End hold
// nothing once they are over.
func TestEndedCallsAreForgotten(t *testing.T) {
	base := runtime.NumGoroutine()
	c := mustNew(t, egress.WithIsolation(isolation(t, "shared"), nil))
	heap := func() uint64 {
		for range 100000 { // the AfterFuncs' goroutines finish
			if runtime.NumGoroutine() <= base {
				break
			}
			runtime.Gosched()
		}
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	for range 50000 {
		ctx, cancel := context.WithCancel(isolate.NewContext(context.Background(), "maps"))
		call := c.Begin(ctx, "")
		cancel() // the caller gives up without End
		<-call.Context().Done()
	}
	if grew := int64(heap()) - int64(before); grew > 2<<20 { // a leak holds 7 MB
		t.Fatalf("the heap grew by %d bytes over 50,000 calls that are over", grew)
	}
}

// A black-holed client type is refused at the caller, on every transport:
// no attempt leaves, and the answer is the server's for it, "overloaded;
// don't retry". The route a call began with travels in its context, for
// the balancer to follow.
func TestBlackHoledClientTypeIsRefusedAtTheCaller(t *testing.T) {
	c := mustNew(t, egress.WithIsolation(isolation(t, "black-hole"), nil))
	var attempts int
	call := c.Begin(isolate.NewContext(context.Background(), "maps"), "")
	defer call.End()
	err := call.Do(false, func(context.Context) error { attempts++; return nil })
	if attempts != 0 || err != isolate.ErrBlackHoled {
		t.Fatalf("a black-holed call: %d attempts, %v; want none and isolate.ErrBlackHoled", attempts, err)
	}
	if _, err := call.Start(); err != isolate.ErrBlackHoled {
		t.Fatalf("a black-holed stream: %v, want isolate.ErrBlackHoled", err)
	}
	if r, ok := isolate.RouteFrom(call.Context()); !ok || r != isolate.BlackHole {
		t.Fatalf("the call's context carries route %v (%v), want BlackHole", r, ok)
	}
	sac := mustNew(t, egress.WithIsolation(isolation(t, "sacrificial"), nil)).Begin(isolate.NewContext(context.Background(), "maps"), "")
	defer sac.End()
	if r, _ := isolate.RouteFrom(sac.Context()); r != isolate.Sacrificial {
		t.Fatalf("a sacrificial call's context carries route %v", r)
	}
}
