package balancing

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

// startWarming serves a relay backend named name whose lifecycle starts
// in lame duck (lifecycle.WithWarmup), announced by response trailers.
func startWarming(t *testing.T, name string) (string, *lifecycle.Lifecycle) {
	t.Helper()
	hs := health.NewServer()
	lc, err := triagegrpc.NewLifecycle(hs, lifecycle.WithWarmup())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}}))), triagegrpc.WithLifecycle(lc))
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(srv.ServerOptions()...)
	healthpb.RegisterHealthServer(s, hs)
	relay.Register(s, &relay.Tier{Name: name})
	return loopback.ServeGRPC(t, s), lc
}

// Lame duck that cannot wedge (issue 22, item 3), over loopback with the
// "triage" balancer and no healthCheckConfig, so that lame duck is known
// only from response trailers. A task that warmed up in lame duck gets
// traffic again after Ready, within the announcement's expiry, without
// clients reconnecting; and while every task is in lame duck, calls are
// served by them instead of waiting for their deadline.
func TestWarmedUpTaskGetsTraffic(t *testing.T) {
	alongside(t)
	addrA, lcA := startWarming(t, "A")
	addrB, lcB := startWarming(t, "B")
	lcA.Ready()
	cc := lbConn(t, []string{addrA, addrB}, `{"loadBalancingConfig":[{"triage":{"policy":"round_robin"}}]}`)
	call := func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return relay.Invoke(ctx, cc, "x")
	}
	// B's trailers announce its lame duck: from B's first answer on, B
	// gets no call while A can take it. Either connection may come up
	// after the other (a loaded machine): until A's has, the calls go to
	// B, lame duck or not, since lame duck tasks still serve. So the calls
	// go on until each has answered one.
	answered := map[string]bool{}
	for deadline := time.Now().Add(20 * time.Second); !answered["A"] || !answered["B"]; {
		got, err := call()
		if err != nil {
			t.Fatal(err)
		}
		answered[got[:1]] = true
		if time.Now().After(deadline) {
			t.Fatalf("A and B did not both answer within 20 s: %v", answered)
		}
	}
	for range 20 { // the balancer takes the announcement in
		if _, err := call(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		if got, err := call(); err != nil || got[:1] != "A" {
			t.Fatalf("call %d with B in lame duck: %q, %v", i, got, err)
		}
	}
	lcB.Ready()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := call()
		if err != nil {
			t.Fatal(err)
		}
		if got[:1] == "B" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("B never got traffic after Ready")
		}
		time.Sleep(20 * time.Millisecond) // paced calls over real sockets
	}
	// Both in lame duck (a rolling restart's worst moment): calls are
	// still served, by the lame duck tasks.
	lcA.EnterLameDuck()
	lcB.EnterLameDuck()
	for i := range 20 {
		if _, err := call(); err != nil {
			t.Fatalf("call %d with every task in lame duck: %v", i, err)
		}
	}
}
