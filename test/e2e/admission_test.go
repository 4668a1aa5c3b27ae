package e2e

// Issue 4 over loopback sockets: admission control installed with
// triagegrpc.WithIntake(intake.WithAdmission) rejects at the tap, serves waiting requests
// highest criticality first, and never leaks a pending request, whatever
// happens to the stream.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

// gate is a handler that blocks until released.
type gate struct {
	mu      sync.Mutex
	entered chan string
	release chan struct{}
}

func startAdmitted(t *testing.T, ctl *admission.Controller, g *gate) string {
	return serveB(t, func(ctx context.Context, body string) error {
		g.entered <- criticality.Of(ctx).String()
		<-g.release
		return nil
	}, triagegrpc.WithIntake(intake.WithAdmission(ctl)))
}

func plainConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr,
		append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
			loopback.Client(t, egress.WithoutPolicy()).DialOptions()...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	loopback.WaitFor(t, what, cond)
}

func TestAdmissionOverLoopback(t *testing.T) {
	ctl, err := admission.New(admission.WithLimits(1, 1, 1), admission.WithQueueFactor(0), admission.WithMaxWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{entered: make(chan string, 64), release: make(chan struct{})}
	cc := plainConn(t, startAdmitted(t, ctl, g))
	call := func(l criticality.Level) <-chan error {
		ch := make(chan error, 1)
		go func() {
			_, err := relay.Invoke(criticality.NewContext(context.Background(), l), cc, "x")
			ch <- err
		}()
		return ch
	}
	// One runs; eight SHEDDABLE wait (queue 0 x 1 + 8).
	first := call(criticality.Critical)
	if got := <-g.entered; got != "CRITICAL" {
		t.Fatalf("entered %s", got)
	}
	var shed []<-chan error
	for i := 0; i < 8; i++ {
		shed = append(shed, call(criticality.Sheddable))
		waitFor(t, "the queue to fill", func() bool { return ctl.Stats().Queued == int64(i+1) })
	}
	// Another SHEDDABLE finds the queue full and nobody less critical to
	// displace: rejected with the standard status.
	err = <-call(criticality.Sheddable)
	if status.Code(err) != codes.Unavailable || !errors.Is(err, outcome.ErrTaskOverloaded) {
		t.Fatalf("an arrival at a full task: %v", err)
	}
	// A CRITICAL_PLUS displaces the oldest SHEDDABLE and is served next.
	vip := call(criticality.CriticalPlus)
	if err := <-shed[0]; status.Code(err) != codes.Unavailable {
		t.Fatalf("the displaced request got %v", err)
	}
	g.release <- struct{}{} // finish the first
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if got := <-g.entered; got != "CRITICAL_PLUS" {
		t.Fatalf("after the first, %s entered; want CRITICAL_PLUS", got)
	}
	close(g.release)
	for _, ch := range append(shed[1:], vip) {
		if err := <-ch; err != nil && status.Code(err) != codes.Unavailable {
			t.Fatalf("err %v", err)
		}
	}
	waitFor(t, "every request to end", func() bool { s := ctl.Stats(); return s.Pending == 0 && s.Executing == 0 && s.Queued == 0 })
}

// Streams that end before their handler runs (cancelled while waiting,
// unknown methods) give back their place.
func TestAdmissionNeverLeaks(t *testing.T) {
	ctl, err := admission.New(admission.WithLimits(1, 1, 1), admission.WithMaxWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{entered: make(chan string, 64), release: make(chan struct{})}
	cc := plainConn(t, startAdmitted(t, ctl, g))
	go relay.Invoke(context.Background(), cc, "x")
	<-g.entered
	for i := 0; i < 20; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { _, err := relay.Invoke(ctx, cc, "x"); done <- err }()
		waitFor(t, "a waiter", func() bool { return ctl.Stats().Queued == 1 })
		cancel()
		<-done
		waitFor(t, "the cancelled waiter to leave", func() bool { return ctl.Stats().Queued == 0 && ctl.Stats().Pending == 1 })
	}
	for i := 0; i < 20; i++ {
		err := cc.Invoke(context.Background(), "/no.such.Service/Method", &struct{}{}, &struct{}{})
		if status.Code(err) != codes.Unimplemented && status.Code(err) != codes.Internal {
			t.Logf("unknown method: %v", err)
		}
	}
	close(g.release)
	waitFor(t, "every request to end", func() bool { s := ctl.Stats(); return s.Pending == 0 && s.Executing == 0 && s.Queued == 0 })
}

// A tier whose handlers wait on the next tier (a frontend, a middle tier)
// gives up its execution slots while they wait: with an execution limit
// of one, four calls in flight at once all reach the next tier, which
// answers only when all four have arrived. Before, the first call held
// the only slot through its downstream call, and the others were refused
// after the controller's maximum wait (or waited for ever).
func TestHandlersWaitingDownstreamHoldNoSlot(t *testing.T) {
	const n = 4
	arrived := make(chan struct{}, n)
	all := make(chan struct{})
	var once sync.Once
	var count sync.WaitGroup
	count.Add(n)
	go func() { count.Wait(); once.Do(func() { close(all) }) }()
	down := serveB(t, func(ctx context.Context, _ string) error {
		arrived <- struct{}{}
		count.Done()
		select {
		case <-all:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	next := plainConn(t, down)
	ctl, err := admission.New(admission.WithLimits(1, 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	front := serveB(t, func(ctx context.Context, body string) error {
		_, err := relay.Invoke(ctx, next, body)
		return err
	}, triagegrpc.WithIntake(intake.WithAdmission(ctl)))
	cc := plainConn(t, front)
	errs := make(chan error, n)
	for range n {
		go func() {
			ctx, cancel := context.WithTimeout(criticality.NewContext(context.Background(), criticality.Critical), 10*time.Second)
			defer cancel()
			_, err := relay.Invoke(ctx, cc, "x")
			errs <- err
		}()
	}
	for i := range n {
		if err := <-errs; err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	if got := len(arrived); got != n {
		t.Errorf("%d of %d calls reached the next tier", got, n)
	}
	once.Do(func() { close(all) })
	waitFor(t, "the front's counters to settle", func() bool {
		s := ctl.Stats()
		return s.Executing == 0 && s.Away == 0 && s.Pending == 0
	})
}

// Health checks bypass admission control: with an execution limit of one,
// many clients' health Watch streams stay open and ordinary calls are
// still admitted (a Watch counted as executing would hold the only slot
// for as long as its connection lives).
func TestHealthChecksBypassAdmission(t *testing.T) {
	ctl, err := admission.New(admission.WithLimits(1, 1, 1), admission.WithQueueFactor(0), admission.WithMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	hs := health.NewServer()
	srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})), intake.WithAdmission(ctl)))
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(srv.ServerOptions()...)
	healthpb.RegisterHealthServer(s, hs)
	relay.Register(s, &relay.Tier{Name: "B", Observe: func(relay.Arrival) {}})
	addr := loopback.ServeGRPC(t, s)
	cc := plainConn(t, addr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 5 {
		w, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health Watch: %v, %v", r, err)
		}
	}
	for i := range 5 {
		if _, err := relay.Invoke(context.Background(), cc, "x"); err != nil {
			t.Fatalf("call %d with 5 health watches open: %v", i, err)
		}
	}
}
