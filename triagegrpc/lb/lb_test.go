package lb_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/triagegrpc"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/triagegrpc/lb"
)

// With every backend at the client's flow-control cap, a call fails at
// once with UNAVAILABLE, task overloaded, instead of waiting in the client
// until its deadline; when a request finishes, calls go through again.
func TestBalancerFlowControlFailsFast(t *testing.T) {
	lb.Register()
	entered, release := make(chan struct{}, 1), make(chan struct{})
	s := grpc.NewServer()
	relay.Register(s, &relay.Tier{Name: "B", Fail: func(ctx context.Context, body string) error {
		if body == "hold" {
			entered <- struct{}{}
			<-release
		}
		return nil
	}})
	r := manual.NewBuilderWithScheme("fctest")
	r.InitialState(resolver.State{Endpoints: []resolver.Endpoint{{Addresses: []resolver.Address{{Addr: loopback.ServeGRPC(t, s)}}}}})
	cc := loopback.DialGRPC(t, r.Scheme()+":///b", grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"triage":{"maxActive":1}}]}`))
	if _, err := relay.Invoke(context.Background(), cc, "warm"); err != nil {
		t.Fatal(err)
	}
	held := make(chan error, 1)
	go func() { _, err := relay.Invoke(context.Background(), cc, "hold"); held <- err }()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := relay.Invoke(ctx, cc, "x")
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "flow-control cap") || time.Since(start) > 5*time.Second {
		t.Fatalf("at the cap: %v after %v, want UNAVAILABLE at once", err, time.Since(start))
	}
	// The refusal is an overload answer, so that the client's throttle
	// counts it as a rejection, not as an accept (issue 22, item 3).
	if oe, ok := triagegrpc.FromStatus(status.Convert(err)); !ok || oe.Kind != outcome.TaskOverloaded {
		t.Errorf("at the cap: %v reads as %v, want task overloaded", err, oe)
	}
	close(release)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if _, err := relay.Invoke(context.Background(), cc, "x"); err != nil {
		t.Fatalf("below the cap again: %v", err)
	}
}

// A backend that answers nothing (its handlers hang; the connection is
// fine) is ejected after five calls in a row end at their deadlines with
// nothing received: the calls after them go to the other backend.
func TestBalancerEjectsHungBackend(t *testing.T) {
	lb.Register()
	release := make(chan struct{})
	hung := grpc.NewServer()
	relay.Register(hung, &relay.Tier{Name: "hung", Fail: func(context.Context, string) error {
		<-release // ignores its deadline: sends nothing at all
		return nil
	}})
	fine := grpc.NewServer()
	relay.Register(fine, &relay.Tier{Name: "fine"})
	hungAddr, fineAddr := loopback.ServeGRPC(t, hung), loopback.ServeGRPC(t, fine)
	t.Cleanup(func() { close(release) }) // before the servers stop
	r := manual.NewBuilderWithScheme("ejecttest")
	r.InitialState(resolver.State{Endpoints: []resolver.Endpoint{
		{Addresses: []resolver.Address{{Addr: hungAddr}}}, {Addresses: []resolver.Address{{Addr: fineAddr}}}}})
	// A long ejection, so that no timing of this machine ends it within
	// the test.
	cc := loopback.DialGRPC(t, r.Scheme()+":///b", grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"triage":{"ejection":"30s"}}]}`))
	cc.Connect()
	// The hung backend's first DefaultEjectAfter picks time out (every
	// other call, round robin), then none: it is ejected. Its connection
	// may come up after the other's (the race detector, or a busy
	// machine), so the calls are counted from the first that times out:
	// until then every call goes to the fine backend.
	n := balance.DefaultEjectAfter
	var failed []int
	first := -1
	for i := 0; first < 0 || i < first+2*n+10; i++ {
		if first < 0 && i >= 1000 {
			t.Fatal("1,000 calls and none went to the hung backend")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, err := relay.Invoke(ctx, cc, "x", grpc.WaitForReady(true))
		cancel()
		if err != nil {
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("call %d: %v", i, err)
			}
			if first < 0 {
				first = i
			}
			failed = append(failed, i-first)
		}
	}
	if len(failed) != n || failed[n-1] > 2*(n-1) {
		t.Fatalf("calls %v timed out, counted from the first, want %d, every other call, then none for at least ten calls", failed, n)
	}
}

// A backend that stops answering under concurrent traffic is ejected
// long before its calls' deadlines: it was picked a few times since its
// last answer, and for 250 ms nothing came from it while the other
// backend answered. Round robin alone would send it half of the calls.
func TestBalancerEjectsStalledBackendBeforeDeadlines(t *testing.T) {
	lb.Register()
	release := make(chan struct{})
	hung := grpc.NewServer()
	relay.Register(hung, &relay.Tier{Name: "hung", Fail: func(context.Context, string) error {
		<-release
		return nil
	}})
	fine := grpc.NewServer()
	relay.Register(fine, &relay.Tier{Name: "fine"})
	hungAddr, fineAddr := loopback.ServeGRPC(t, hung), loopback.ServeGRPC(t, fine)
	t.Cleanup(func() { close(release) })
	r := manual.NewBuilderWithScheme("stalltest")
	r.InitialState(resolver.State{Endpoints: []resolver.Endpoint{
		{Addresses: []resolver.Address{{Addr: hungAddr}}}, {Addresses: []resolver.Address{{Addr: fineAddr}}}}})
	cc := loopback.DialGRPC(t, r.Scheme()+":///b", grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"triage":{"ejection":"30s"}}]}`))
	cc.Connect()
	// 300 calls paced 5 ms apart, each with a deadline (3 s) past the
	// pacing, so that no call ends unanswered before the last is sent:
	// only the stall can eject the hung backend in time.
	const calls = 300
	errs := make(chan error, calls)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for range calls {
		<-tick.C
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			_, err := relay.Invoke(ctx, cc, "x", grpc.WaitForReady(true))
			errs <- err
		}()
	}
	lost := 0
	for range calls {
		if err := <-errs; err != nil {
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatal(err)
			}
			lost++
		}
	}
	if lost >= calls/3 {
		t.Fatalf("%d of %d calls went to the stalled backend (round robin: half)", lost, calls)
	}
	t.Logf("%d of %d calls went to the stalled backend", lost, calls)
}

// A malformed configuration is refused when the service config is parsed.
func TestParseConfigErrors(t *testing.T) {
	for _, js := range []string{
		`{"policy":"fastest"}`, `{"maxActive":-5}`, `{"subsetSize":-2}`, `{"replaceAfter":"0s"}`, `{"replaceAfter":"2m"}`, `{"replaceAfter":"soon"}`,
		`{"subsetSize":3,"clientId":-1}`, `{"subsetAlgorithm":"consistent"}`, `{"errorWindow":"soon"}`,
		`{"weightPeriod":"0s"}`, `{"blackout":"-1s"}`, `{"errorPenalty":-1}`, `{"errorWeight":-1}`, `{"unknown":1}`, `[]`,
		`{"ejectAfter":-1}`, `{"ejectAfter":70000}`, `{"ejection":"soon"}`, `{"ejection":"0s"}`, `{"ejection":"1h"}`,
		`{"stallPicks":-1}`, `{"stallPicks":70000}`, `{"stallAfter":"soon"}`, `{"stallAfter":"0s"}`, `{"stallAfter":"1h"}`,
	} {
		if _, err := lb.ParseConfig([]byte(js)); err == nil {
			t.Errorf("%s accepted", js)
		}
	}
	for _, js := range []string{`{"policy":"least_loaded","subsetSize":20,"clientId":3,"blackout":"0s","maxActive":-1}`,
		`{"ejectAfter":0}`, `{"ejectAfter":3,"ejection":"500ms"}`, `{"ejection":"30s"}`,
		`{"stallPicks":0}`, `{"stallPicks":8,"stallAfter":"1s"}`,
		`{"subsetSize":3}`, `{"subsetSize":-1}`, `{"subsetSize":5,"clientId":2,"replaceAfter":"200ms"}`} {
		if _, err := lb.ParseConfig([]byte(js)); err != nil {
			t.Errorf("a good config %s refused: %v", js, err)
		}
	}
}

// FuzzParseConfig: service configs come from resolvers (DNS TXT
// records, xDS); whatever the bytes, parsing returns a config New accepts
// or an error, never a panic.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"policy":"weighted_round_robin","subsetSize":20,"clientId":7,"weightPeriod":"250ms"}`))
	f.Add([]byte(`{"policy":"least_loaded","errorWeight":0,"maxActive":-1}`))
	f.Add([]byte(`{"errorPenalty":1e308,"expiry":"9999999h"}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"ejectAfter":5,"ejection":"2s"}`))
	f.Add([]byte(`{"stallPicks":4,"stallAfter":"250ms"}`))
	f.Add([]byte(`{"subsetSize":-1,"replaceAfter":"500ms"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = lb.ParseConfig(b)
	})
}
