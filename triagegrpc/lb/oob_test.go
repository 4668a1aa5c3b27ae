package lb_test

import (
	"context"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	_ "google.golang.org/grpc/balancer/weightedroundrobin" // stock weighted_round_robin
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/loadreport"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagegrpc/lb"
)

// meteredBackend serves the relay with load reports from a Meter that has
// measured for 30 s and saw 1,000 requests (from other clients) at the
// given utilization: out of band (ORCA's service) when oob, else in each
// answer's trailer. It counts the calls it serves.
func meteredBackend(t *testing.T, util float64, served *atomic.Int64, oob bool) string {
	t.Helper()
	clk := clock.NewFake(time.Unix(0, 0))
	m, err := loadreport.New(loadreport.WithUtilization(func() float64 { return util }), loadreport.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(30 * time.Second)
	for range 1000 {
		m.Record(false)
	}
	var gs *grpc.Server
	if oob {
		gs = grpc.NewServer()
		if err := triagegrpc.RegisterLoadReportService(gs, m); err != nil {
			t.Fatal(err)
		}
	} else {
		srv, err := triagegrpc.NewServer(triagegrpc.WithLoadReports(m))
		if err != nil {
			t.Fatal(err)
		}
		gs = grpc.NewServer(srv.ServerOptions()...)
	}
	relay.Register(gs, &relay.Tier{Name: "backend", Fail: func(context.Context, string) error {
		served.Add(1)
		return nil
	}})
	return loopback.ServeGRPC(t, gs)
}

// dialBackends dials addrs (in sorted order, the balancer's) with the
// given service config.
func dialBackends(t *testing.T, scheme, config string, addrs ...string) *grpc.ClientConn {
	t.Helper()
	sort.Strings(addrs)
	r := manual.NewBuilderWithScheme(scheme)
	var eps []resolver.Endpoint
	for _, a := range addrs {
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
	}
	r.InitialState(resolver.State{Endpoints: eps})
	return loopback.DialGRPC(t, r.Scheme()+":///b", grpc.WithResolvers(r), grpc.WithDefaultServiceConfig(config))
}

// reported closes ready when a balancer's weights first cover every
// endpoint of its subset.
type reported struct {
	balance.Nop
	n     int
	once  sync.Once
	ready chan struct{}
}

func (r *reported) Observer(string) balance.Observer { return r }
func (r *reported) Add(string, *balance.Balancer)    {}
func (r *reported) Remove(*balance.Balancer)         {}
func (r *reported) WeightsUpdated(b *balance.Balancer) {
	eps := b.Endpoints()
	for _, e := range eps {
		if e.Weight() <= 0 {
			return
		}
	}
	if len(eps) == r.n {
		r.once.Do(func() { close(r.ready) })
	}
}

// A client that has sent nothing yet splits its first calls by the
// backends' out-of-band load reports: the same rate at 20% and at 80%
// utilization weighs 4 to 1. The calls start once both reports are in
// (on a busy machine they can come after the connections are ready).
func TestBalancerFirstPicksFollowOOBReports(t *testing.T) {
	rep := &reported{n: 2, ready: make(chan struct{})}
	lb.Register(lb.WithMetrics(rep))
	defer lb.Register()
	var light, heavy atomic.Int64
	cc := dialBackends(t, "oobtest", `{"loadBalancingConfig":[{"triage":{"policy":"weighted_round_robin","oobLoadReport":true}}]}`,
		meteredBackend(t, 0.2, &light, true), meteredBackend(t, 0.8, &heavy, true))
	cc.Connect()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for st := cc.GetState(); st != connectivity.Ready && cc.WaitForStateChange(ctx, st); st = cc.GetState() {
	}
	select {
	case <-rep.ready:
	case <-ctx.Done():
		t.Fatal("no out-of-band report from both backends within 10 s")
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

// Stock grpc-go weighted_round_robin with enableOobLoadReport splits
// traffic by the out-of-band reports of two triage backends: the same
// requests cost 1 ms of "CPU" on one and 3 ms on the other (utilization =
// the backend's rate x its cost), so the weights (rate / utilization)
// imply 3 to 1. grpc-go's orca service reports every 30 s at most and wrr
// waits out its 10 s blackout, so this takes about 70 s: a measurement
// (TRIAGE_MEASURE=1).
func TestStockWRRFollowsOOBReports(t *testing.T) {
	if os.Getenv("TRIAGE_MEASURE") != "1" {
		t.Skip("a 70 s measurement: TRIAGE_MEASURE=1")
	}
	var served [2]atomic.Int64
	backend := func(i int, cost float64) string {
		rate, err := loadreport.New(loadreport.WithUtilization(func() float64 { return 0 }))
		if err != nil {
			t.Fatal(err)
		}
		m, err := loadreport.New(loadreport.WithUtilization(func() float64 { return rate.Load().QPS * cost }))
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		if err := triagegrpc.RegisterLoadReportService(gs, m); err != nil {
			t.Fatal(err)
		}
		relay.Register(gs, &relay.Tier{Name: "backend", Fail: func(context.Context, string) error {
			served[i].Add(1)
			rate.Record(false)
			m.Record(false)
			return nil
		}})
		return loopback.ServeGRPC(t, gs)
	}
	cheap, dear := backend(0, 0.001), backend(1, 0.003)
	r := manual.NewBuilderWithScheme("stockwrr")
	r.InitialState(resolver.State{Endpoints: []resolver.Endpoint{
		{Addresses: []resolver.Address{{Addr: cheap}}}, {Addresses: []resolver.Address{{Addr: dear}}}}})
	cc := loopback.DialGRPC(t, r.Scheme()+":///b", grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"weighted_round_robin":{"enableOobLoadReport":true,"oobReportingPeriod":"1s"}}]}`))
	start := time.Now()
	var mark [2]int64
	for i := 0; time.Since(start) < 75*time.Second && i < 20000; i++ { // 200 calls a second
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		relay.Invoke(ctx, cc, "x")
		cancel()
		if mark == [2]int64{} && time.Since(start) >= 50*time.Second {
			mark = [2]int64{served[0].Load(), served[1].Load()}
		}
		time.Sleep(5 * time.Millisecond)
	}
	c, d := served[0].Load()-mark[0], served[1].Load()-mark[1]
	ratio := float64(c) / float64(max(d, 1))
	t.Logf("from 50 s to 75 s: %d calls to the 1 ms backend, %d to the 3 ms one (ratio %.2f, the weights imply 3)", c, d, ratio)
	if ratio < 2.25 || ratio > 3.75 {
		t.Fatalf("split %d:%d, want 3:1 within 25%%", c, d)
	}
}

// A client that starts among backends that have measured their load for
// longer than the blackout weighs them from their first answers' trailers
// (the reports say over how long they were measured): its calls split
// 4 to 1 by utilization at once, not evenly for the first 10 s. A client
// restarted in a rolling restart would otherwise send a small task as
// much as a big one for its first 10 s.
func TestBalancerWeighsLongMeasuredReportsAtOnce(t *testing.T) {
	rep := &reported{n: 2, ready: make(chan struct{})}
	lb.Register(lb.WithMetrics(rep))
	defer lb.Register()
	var light, heavy atomic.Int64
	cc := dialBackends(t, "spantest", `{"loadBalancingConfig":[{"triage":{"policy":"weighted_round_robin"}}]}`,
		meteredBackend(t, 0.2, &light, false), meteredBackend(t, 0.8, &heavy, false))
	// Calls until both backends' weights are in: under the blackout (10 s)
	// only if the reports' span counts.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for warm := false; !warm; {
		if _, err := relay.Invoke(ctx, cc, "x"); err != nil {
			t.Fatalf("no weight for both backends before the blackout would end: %v", err)
		}
		select {
		case <-rep.ready:
			warm = true
		default:
		}
	}
	light.Store(0)
	heavy.Store(0)
	const calls = 200
	for range calls {
		if _, err := relay.Invoke(ctx, cc, "x"); err != nil {
			t.Fatal(err)
		}
	}
	l, h := light.Load(), heavy.Load()
	ratio := float64(l) / float64(max(h, 1))
	t.Logf("%d calls: %d to the backend at 20%%, %d to the one at 80%% (ratio %.2f, weights imply 4)", calls, l, h, ratio)
	if ratio < 3 || ratio > 5 {
		t.Fatalf("split %d:%d, want about 4:1 (within 25%%)", l, h)
	}
}

// targets is a Tracker that records the targets of the balancers added.
type targets struct {
	balance.Nop
	mu    sync.Mutex
	added []string
}

func (r *targets) Observer(string) balance.Observer { return r }
func (r *targets) Remove(*balance.Balancer)         {}
func (r *targets) Add(target string, _ *balance.Balancer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.added = append(r.added, target)
}

func (r *targets) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.added)
}

// Two ClientConns of one process, the balancer registered once without a
// Tracker, report each to the Tracker its resolver state names: a process
// with several proxies need not change grpc-go's registry while its
// connections run.
func TestWithTrackerIsPerClientConn(t *testing.T) {
	lb.Register()
	var served atomic.Int64
	addr := meteredBackend(t, 0.5, &served, false)
	var trackers [2]targets
	for i, scheme := range []string{"trackera", "trackerb"} {
		r := manual.NewBuilderWithScheme(scheme)
		r.InitialState(lb.WithTracker(resolver.State{Endpoints: []resolver.Endpoint{{Addresses: []resolver.Address{{Addr: addr}}}}}, &trackers[i]))
		cc := loopback.DialGRPC(t, r.Scheme()+":///b", grpc.WithResolvers(r),
			grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"triage":{}}]}`))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := relay.Invoke(ctx, cc, "x"); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	for i, want := range []string{"trackera:///b", "trackerb:///b"} {
		if got := trackers[i].seen(); !slices.Equal(got, []string{want}) {
			t.Errorf("tracker %d saw balancers for %q, want only %q", i, got, want)
		}
	}
}
