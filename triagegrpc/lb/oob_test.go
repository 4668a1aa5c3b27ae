package lb_test

import (
	"context"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/internal/loopback"
	"github.com/triagehq/triage/internal/relay"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagegrpc/lb"
)

// oobBackend serves the relay and ORCA's out-of-band load reports from a
// Meter that already saw 1,000 requests (from other clients) at the given
// utilization; it counts the calls it serves.
func oobBackend(t *testing.T, util float64, served *atomic.Int64) string {
	t.Helper()
	m, err := balance.NewMeter(balance.WithUtilization(func() float64 { return util }))
	if err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		m.Record(false)
	}
	gs := grpc.NewServer()
	if err := triagegrpc.RegisterLoadReportService(gs, m); err != nil {
		t.Fatal(err)
	}
	relay.Register(gs, &relay.Tier{Name: "backend", Fail: func(context.Context, string) error {
		served.Add(1)
		return nil
	}})
	return loopback.ServeGRPC(t, gs)
}

// A client that has sent nothing yet splits its first calls by the
// backends' out-of-band load reports: the same rate at 20% and at 80%
// utilization weighs 4 to 1.
func TestBalancerFirstPicksFollowOOBReports(t *testing.T) {
	lb.Register()
	var light, heavy atomic.Int64
	addrs := []string{oobBackend(t, 0.2, &light), oobBackend(t, 0.8, &heavy)}
	sort.Strings(addrs)
	r := manual.NewBuilderWithScheme("oobtest")
	var eps []resolver.Endpoint
	for _, a := range addrs {
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
	}
	r.InitialState(resolver.State{Endpoints: eps})
	cc := loopback.DialGRPC(t, r.Scheme()+":///b", grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"triage":{"policy":"weighted_round_robin","oobLoadReport":true}}]}`))
	cc.Connect()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for st := cc.GetState(); st != connectivity.Ready && cc.WaitForStateChange(ctx, st); st = cc.GetState() {
	}
	const calls = 200
	for range calls {
		if _, err := relay.Invoke(ctx, cc, "x"); err != nil {
			t.Fatal(err)
		}
	}
	l, h := light.Load(), heavy.Load()
	ratio := float64(l) / float64(max(h, 1))
	t.Logf("first %d calls: %d to the backend at 20%%, %d to the one at 80%% (ratio %.2f, weights imply 4)", calls, l, h, ratio)
	if ratio < 3 || ratio > 5 {
		t.Fatalf("split %d:%d, want about 4:1 (within 25%%)", l, h)
	}
}
