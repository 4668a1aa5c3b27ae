package triagegrpc

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health" // also enables client-side health checking for service configs that ask for it

	"github.com/triagehq/triage/clock"
)

// Lifecycle is a backend task's serving state: SRE book ch. 20, "A Robust
// Approach to Unhealthy Tasks: Lame Duck State". A task in lame duck still
// serves everything that reaches it, but asks its clients to send new
// requests elsewhere:
//
//   - through gRPC health checking (the health server reports NOT_SERVING,
//     which clients with healthCheckConfig in their service config learn
//     at once from their watch stream, active or idle), and
//   - in every response (a triage-lame-duck: 1 trailer, when the Server has
//     WithLifecycle), which triage's balancer acts on.
//
// Shutdown is the book's clean shutdown: enter lame duck, keep serving for
// the drain interval, then stop gracefully (in-flight requests finish).
// Call it from the SIGTERM handler:
//
//	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM)
//	defer stop()
//	<-ctx.Done()
//	lc.Shutdown(context.Background(), grpcServer)
//
// A task can start in lame duck while it warms up (WithWarmup) and call
// Ready when it can serve.
type Lifecycle struct {
	health *health.Server
	drain  time.Duration
	clock  clock.Clock
	lame   atomic.Bool
}

// LifecycleOption configures a Lifecycle.
type LifecycleOption func(*Lifecycle)

// WithDrain sets how long Shutdown keeps serving in lame duck before it
// stops the server. Default 30 s (the book: "between 10s and 150s
// depending on client complexity").
func WithDrain(d time.Duration) LifecycleOption { return func(l *Lifecycle) { l.drain = d } }

// WithWarmup starts the task in lame duck: clients connect but send
// nothing until Ready.
func WithWarmup() LifecycleOption { return func(l *Lifecycle) { l.lame.Store(true) } }

// WithLifecycleClock sets the clock of the drain interval. Default
// clock.Real().
func WithLifecycleClock(c clock.Clock) LifecycleOption { return func(l *Lifecycle) { l.clock = c } }

// NewLifecycle returns a Lifecycle announcing the task's state through hs
// (register hs on the grpc.Server with healthpb.RegisterHealthServer, and
// pass the Lifecycle to NewServer with WithLifecycle).
func NewLifecycle(hs *health.Server, opts ...LifecycleOption) (*Lifecycle, error) {
	if hs == nil {
		return nil, errors.New("triagegrpc: a Lifecycle needs a health.Server")
	}
	l := &Lifecycle{health: hs, drain: 30 * time.Second}
	for _, o := range opts {
		o(l)
	}
	if l.drain < 0 {
		return nil, errors.New("triagegrpc: negative drain interval")
	}
	l.clock = clock.OrReal(l.clock)
	if l.lame.Load() {
		hs.Shutdown() // every service NOT_SERVING until Ready
	}
	return l, nil
}

// InLameDuck reports whether the task is in lame duck.
func (l *Lifecycle) InLameDuck() bool { return l.lame.Load() }

// Ready announces that the task serves: health SERVING, no lame duck.
func (l *Lifecycle) Ready() {
	l.lame.Store(false)
	l.health.Resume()
}

// EnterLameDuck asks every client to send new requests elsewhere. The task
// keeps serving.
func (l *Lifecycle) EnterLameDuck() {
	l.lame.Store(true)
	l.health.Shutdown()
}

// Shutdown enters lame duck, serves on for the drain interval (or until
// ctx ends), then stops srv gracefully: it returns when every request in
// flight has finished.
func (l *Lifecycle) Shutdown(ctx context.Context, srv *grpc.Server) error {
	l.EnterLameDuck()
	t := l.clock.NewTimer(l.drain)
	defer t.Stop()
	var err error
	select {
	case <-t.C():
	case <-ctx.Done():
		err = ctx.Err()
	}
	srv.GracefulStop()
	return err
}
