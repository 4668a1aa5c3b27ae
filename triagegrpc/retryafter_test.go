package triagegrpc_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

// everything is a Signal past every threshold.
type everything struct{}

func (everything) Name() string         { return "everything" }
func (everything) Utilization() float64 { return 2 }

// retries counts a Policy's retries per level.
type retries struct {
	n [criticality.NumLevels]atomic.Int64
}

func (*retries) Requested(criticality.Level)      {}
func (*retries) Answered(criticality.Level, bool) {}
func (*retries) Throttled(criticality.Level)      {}
func (r *retries) Retried(l criticality.Level)    { r.n[l].Add(1) }
func (*retries) BudgetRefused(criticality.Level)  {}
func (*retries) Exhausted(criticality.Level)      {}

// Over loopback: once a task has shed SHEDDABLE for a while, its
// rejections carry RetryInfo with the grown delay, and a triage client
// does not retry them within a deadline shorter than the delay; CRITICAL
// rejections carry none and are retried at once.
func TestSheddableRejectionsTellClientsToComeBackLater(t *testing.T) {
	f := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	ctl, err := admission.New(admission.WithClock(f), admission.WithSignal(everything{}, admission.DefaultThresholds()))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32", "::1/128"}})), intake.WithAdmission(ctl)))
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(srv.ServerOptions()...)
	relay.Register(gs, &relay.Tier{Name: "backend"})
	addr := loopback.ServeGRPC(t, gs)

	plain := loopback.DialGRPC(t, addr, loopback.Client(t, egress.WithoutPolicy()).DialOptions()...)
	call := func(cc *grpc.ClientConn, l criticality.Level) error {
		ctx, cancel := context.WithTimeout(criticality.NewContext(context.Background(), l), 300*time.Millisecond)
		defer cancel()
		_, err := relay.Invoke(ctx, cc, "x")
		return err
	}
	// Shed SHEDDABLE for 4 s of the task's time.
	for range 9 {
		if err := call(plain, criticality.Sheddable); status.Code(err) != codes.Unavailable {
			t.Fatalf("not rejected: %v", err)
		}
		f.Advance(500 * time.Millisecond)
	}
	err = call(plain, criticality.Sheddable)
	var ri *errdetails.RetryInfo
	for _, d := range status.Convert(err).Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			ri = r
		}
	}
	if ri == nil || ri.GetRetryDelay().AsDuration() < 2500*time.Millisecond {
		t.Fatalf("after 4.5 s of shedding: %v carries RetryInfo %v, want >= 2.5 s", err, ri)
	}
	var oe *outcome.Error
	if !errors.As(err, &oe) || oe.Kind != outcome.TaskOverloaded || oe.RetryAfter < 4*time.Second*5/8 || oe.RetryAfter > 4*time.Second {
		t.Fatalf("after 4.5 s of shedding: %v (RetryAfter want in [2.5 s, 4 s])", err)
	}
	if err := call(plain, criticality.Critical); !errors.As(err, &oe) || oe.RetryAfter != 0 {
		t.Fatalf("CRITICAL rejection: %v, want no RetryAfter", err)
	}

	var obs retries
	pol, err := retry.New(retry.WithoutBudget(), retry.WithoutThrottle(), retry.WithBackoff(0, time.Second), retry.WithObserver(&obs))
	if err != nil {
		t.Fatal(err)
	}
	cc := loopback.DialGRPC(t, addr, loopback.Client(t, egress.WithPolicy(pol)).DialOptions()...)
	call(cc, criticality.Critical) // before retries are common enough to say "don't retry"
	if n := obs.n[criticality.Critical].Load(); n != 2 {
		t.Errorf("%d CRITICAL retries, want 2", n)
	}
	for range 10 {
		err := call(cc, criticality.Sheddable)
		if !errors.As(err, &oe) || oe.Kind != outcome.DontRetry || oe.RetryAfter < 2500*time.Millisecond {
			t.Fatalf("SHEDDABLE through the Policy: %v, want don't retry with the server's RetryAfter", err)
		}
	}
	if n := obs.n[criticality.Sheddable].Load(); n != 0 {
		t.Errorf("%d SHEDDABLE retries sent against RetryAfter", n)
	}
}
