package triagegrpc_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/triagegrpc"
)

// Issue 38: lateness the server caused is not the connection's fault. An
// interceptor chained before triage's (an auth call to an identity
// provider) takes 600 ms, past the message timeout, on a call whose
// message came at once: that call may be refused as late, but its
// connection is not penalised, and the next call on it is served.
func TestServerDelayDoesNotPenaliseTheConnection(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	ctl, err := admission.New(admission.WithClock(f), admission.WithDelayMeasure(admission.SchedulerDelay),
		admission.WithLimits(1, 1, 1), admission.WithInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ts, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithAdmission(ctl)), triagegrpc.WithServerClock(f))
	if err != nil {
		t.Fatal(err)
	}
	var slow atomic.Bool
	slow.Store(true)
	auth := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if slow.Swap(false) {
			f.Advance(600 * time.Millisecond) // the identity provider answers late
		}
		return h(ctx, req)
	}
	s := grpc.NewServer(append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(auth)}, ts.ServerOptions()...)...)
	relay.RegisterFunc(s, func(_ context.Context, body string) (string, error) { return body, nil })
	cc := loopback.DialGRPC(t, loopback.ServeGRPC(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	relay.Invoke(ctx, cc, "slow auth") // refused as late or served: either is fair
	if got, err := relay.Invoke(ctx, cc, "next"); err != nil || got != "next" {
		t.Fatalf("the next call on the connection: %q, %v, want served", got, err)
	}
}
