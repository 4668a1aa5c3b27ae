package triagegrpc_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagegrpc/lb"
	"github.com/triagehq/triage/wire"
)

// A task that starts in lame duck (warming up) announces readiness, then
// lame duck again on shutdown: health checking and the response trailer
// say so, and Shutdown stops the server only after the drain interval.
func TestLifecycleOverLoopback(t *testing.T) {
	if _, err := triagegrpc.NewLifecycle(nil); err == nil {
		t.Fatal("a Lifecycle without a health server")
	}
	if _, err := triagegrpc.NewLifecycle(health.NewServer(), lifecycle.WithDrain(-time.Second)); err == nil {
		t.Fatal("a negative drain interval")
	}
	clk := clock.NewFake(time.Unix(0, 0))
	hs := health.NewServer()
	lc, s := warmingServer(t, hs, clk)
	healthpb.RegisterHealthServer(s, hs)
	relay.Register(s, &relay.Tier{Name: "B"})
	cc := loopback.DialGRPC(t, loopback.ServeGRPC(t, s))
	hc := healthpb.NewHealthClient(cc)
	check := func(want healthpb.HealthCheckResponse_ServingStatus, lame bool) {
		t.Helper()
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil || r.GetStatus() != want {
			t.Fatalf("health %v, %v; want %v", r.GetStatus(), err, want)
		}
		var tr metadata.MD
		if _, err := relay.Invoke(context.Background(), cc, "x", grpc.Trailer(&tr)); err != nil {
			t.Fatal(err) // a task in lame duck still serves
		}
		if got := len(tr.Get(wire.LameDuckKey)) > 0; got != lame || lc.InLameDuck() != lame {
			t.Fatalf("lame duck trailer %v, InLameDuck %v; want %v", tr, lc.InLameDuck(), lame)
		}
	}
	check(healthpb.HealthCheckResponse_NOT_SERVING, true) // warming up
	lc.Ready()
	check(healthpb.HealthCheckResponse_SERVING, false)
	done := make(chan error, 1)
	go func() { done <- lc.Shutdown(context.Background(), triagegrpc.GracefulStop(s)) }()
	clk.BlockUntil(1, nil) // Shutdown waits on its drain timer
	check(healthpb.HealthCheckResponse_NOT_SERVING, true)
	select {
	case <-done:
		t.Fatal("Shutdown returned before the drain interval")
	default:
	}
	clk.Advance(10 * time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := relay.Invoke(context.Background(), cc, "x"); err == nil {
		t.Fatal("the server still serves after Shutdown")
	}
}

// warmingServer returns a gRPC server with a Lifecycle announced through
// hs, warming up, with a 10 s drain on clk.
func warmingServer(t *testing.T, hs *health.Server, clk clock.Clock) (*lifecycle.Lifecycle, *grpc.Server) {
	t.Helper()
	lc, err := triagegrpc.NewLifecycle(hs, lifecycle.WithWarmup(), lifecycle.WithDrain(10*time.Second), lifecycle.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := triagegrpc.NewServer(triagegrpc.WithLifecycle(lc))
	if err != nil {
		t.Fatal(err)
	}
	return lc, grpc.NewServer(srv.ServerOptions()...)
}

// The liveness service stays SERVING in warm-up and lame duck, while the
// readiness service ("") follows the lifecycle; the other health calls
// still reach hs.
func TestLivenessStaysServing(t *testing.T) {
	hs := health.NewServer()
	lc, s := warmingServer(t, hs, clock.NewFake(time.Unix(0, 0)))
	healthpb.RegisterHealthServer(s, triagegrpc.HealthServer(hs))
	cc := loopback.DialGRPC(t, loopback.ServeGRPC(t, s))
	hc := healthpb.NewHealthClient(cc)
	check := func(service string, want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
		if err != nil || r.GetStatus() != want {
			t.Fatalf("health of %q: %v, %v; want %v", service, r.GetStatus(), err, want)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watch, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: triagegrpc.LivenessService})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := watch.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watching liveness: %v, %v", r, err)
	}
	check("", healthpb.HealthCheckResponse_NOT_SERVING) // warming up
	check(triagegrpc.LivenessService, healthpb.HealthCheckResponse_SERVING)
	lc.Ready()
	check("", healthpb.HealthCheckResponse_SERVING)
	list, err := hc.List(context.Background(), &healthpb.HealthListRequest{})
	if err != nil || list.GetStatuses()[triagegrpc.LivenessService].GetStatus() != healthpb.HealthCheckResponse_SERVING ||
		list.GetStatuses()[""].GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("List: %v, %v", list, err)
	}
	lc.EnterLameDuck()
	check("", healthpb.HealthCheckResponse_NOT_SERVING)
	check(triagegrpc.LivenessService, healthpb.HealthCheckResponse_SERVING)
	if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "unknown"}); err == nil {
		t.Fatal("an unknown service is not found")
	}
}

// An idle client holds no connection and no health check, yet lame duck
// news reaches it: when its next call wakes it, it connects again and
// watches each backend's health before the first pick, so that none of
// its calls lands on the backend that entered lame duck while it slept,
// and none fails.
func TestLameDuckReachesIdleClient(t *testing.T) {
	lb.Register()
	var eps []resolver.Endpoint
	lcs := map[string]*lifecycle.Lifecycle{}
	for _, name := range []string{"A", "B"} {
		hs := health.NewServer()
		lc, err := triagegrpc.NewLifecycle(hs)
		if err != nil {
			t.Fatal(err)
		}
		srv, err := triagegrpc.NewServer(triagegrpc.WithLifecycle(lc))
		if err != nil {
			t.Fatal(err)
		}
		s := grpc.NewServer(srv.ServerOptions()...)
		healthpb.RegisterHealthServer(s, hs)
		relay.Register(s, &relay.Tier{Name: name})
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: loopback.ServeGRPC(t, s)}}})
		lcs[name] = lc
	}
	r := manual.NewBuilderWithScheme("idle")
	r.InitialState(resolver.State{Endpoints: eps})
	opts := append(idleClient(t, 100*time.Millisecond).DialOptions(),
		grpc.WithResolvers(r), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"triage": {"policy": "round_robin"}}], "healthCheckConfig": {"serviceName": ""}}`))
	cc, err := grpc.NewClient(r.Scheme()+":///backends", opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	served := func(n int) map[string]int {
		t.Helper()
		by := map[string]int{}
		for range n {
			trace, err := relay.Invoke(ctx, cc, "x")
			if err != nil {
				t.Fatal(err)
			}
			by[trace[:1]]++
		}
		return by
	}
	for by := served(20); by["A"] == 0 || by["B"] == 0; by = served(20) { // both connected and SERVING
		if ctx.Err() != nil {
			t.Fatalf("awake, both backends should serve: %v", by)
		}
	}
	idle := func() {
		t.Helper()
		for s := cc.GetState(); s != connectivity.Idle; s = cc.GetState() {
			if !cc.WaitForStateChange(ctx, s) {
				t.Fatalf("the client never went idle (state %v)", s)
			}
		}
	}
	idle()
	lcs["A"].EnterLameDuck() // while the client holds no connection
	if by := served(20); by["A"] != 0 || by["B"] != 20 {
		t.Fatalf("woken after A entered lame duck: %v, want all 20 on B", by)
	}
	idle()
	lcs["A"].Ready()
	for by := served(20); by["A"] == 0; by = served(20) { // A's SERVING arrives by its watch
		if ctx.Err() != nil {
			t.Fatal("A never served again after Ready")
		}
	}
}

// A health Watch that its client never closes held GracefulStop, and so
// SIGTERM, forever: Shutdown now stops hard when its context ends.
func TestShutdownBoundedWithWatchOpen(t *testing.T) {
	hs := health.NewServer()
	lc, err := triagegrpc.NewLifecycle(hs, lifecycle.WithDrain(0))
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, hs)
	cc := loopback.DialGRPC(t, loopback.ServeGRPC(t, s))
	w, err := healthpb.NewHealthClient(cc).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- lc.Shutdown(ctx, triagegrpc.GracefulStop(s)) }()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Shutdown = %v, want context.Canceled", err)
	}
	for {
		if _, err := w.Recv(); err != nil {
			break // the server stopped: the watch ended
		}
	}
}

// idleClient returns a loopback Client without a policy whose connections
// go idle after d.
func idleClient(t *testing.T, d time.Duration) *triagegrpc.Client {
	t.Helper()
	c, err := triagegrpc.NewClient(loopback.Caller(t, egress.WithoutPolicy()), triagegrpc.WithIdleTimeout(d))
	if err != nil {
		t.Fatal(err)
	}
	return c
}
