package e2e

// Issue 20, a hostile peer over loopback: a slow sender opens streams and
// sends their messages late. Its streams stop holding room in the task
// after four target delays, so well-behaved requests are admitted beside
// them, and a message later than the message timeout is refused before
// its handler runs. The controller runs on a fake clock with the
// scheduler's delay measure, as a real server's does on the real one.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/relay"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/triagegrpc"
)

func TestSlowSendersOverLoopback(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	obs := &refusals{}
	ctl, err := admission.New(admission.WithClock(f), admission.WithDelayMeasure(admission.SchedulerDelay),
		admission.WithLimits(1, 1, 1), admission.WithInterval(time.Hour), admission.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	var served atomic.Int64
	addr := serveB(t, func(context.Context, string) error { served.Add(1); return nil }, triagegrpc.WithAdmission(ctl))
	cc := plainConn(t, addr)
	ctx, cancel := context.WithCancel(criticality.NewContext(context.Background(), criticality.Critical))
	defer cancel()

	// The slow sender: streams to the unary method, headers only, until
	// the task refuses one.
	var slow []grpc.ClientStream
	desc := &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}
	for len(slow) < 200 {
		cs, err := cc.NewStream(ctx, desc, relay.CallMethod)
		if err != nil {
			t.Fatal(err)
		}
		n := int64(len(slow) + 1)
		waitFor(t, "the stream to arrive", func() bool { return ctl.Stats().Pending == n || obs.n.Load() > 0 })
		if obs.n.Load() > 0 {
			break // refused: the task is full of streams without messages
		}
		slow = append(slow, cs)
	}
	if len(slow) == 200 {
		t.Fatal("200 streams without messages and the task never filled")
	}
	if _, err := relay.Invoke(ctx, cc, "fresh"); status.Code(err) != codes.Unavailable {
		t.Fatalf("a call while the task is full: %v, want refused", err)
	}

	// Four target delays on, the streams still without messages hold no
	// room: a well-behaved call is admitted and served.
	f.Advance(5 * admission.DefaultTargetDelay)
	if _, err := relay.Invoke(ctx, cc, "fresh"); err != nil {
		t.Fatalf("a call beside %d streams waiting for their messages: %v", len(slow), err)
	}

	// Past the message timeout, the slow messages arrive: refused, late,
	// before any handler runs.
	f.Advance(admission.DefaultMessageTimeout)
	for i, cs := range slow {
		if err := cs.SendMsg(wrapperspb.String("slow")); err != nil {
			t.Fatalf("stream %d: send: %v", i, err)
		}
		cs.CloseSend()
		err := cs.RecvMsg(new(wrapperspb.StringValue))
		oe, ok := outcome.As(err)
		if status.Code(err) != codes.Unavailable || !errors.Is(err, outcome.ErrTaskOverloaded) || !ok || oe.Reason != admission.Late.String() {
			t.Fatalf("stream %d: a message past the message timeout got %v, want task overloaded, late", i, err)
		}
	}
	if n := served.Load(); n != 1 {
		t.Fatalf("%d handlers ran, want 1 (the well-behaved call)", n)
	}
	waitFor(t, "every request to end", func() bool { s := ctl.Stats(); return s.Executing == 0 && s.Queued == 0 })
}

// refusals counts the controller's rejections.
type refusals struct {
	admission.Nop
	n atomic.Int64
}

func (r *refusals) Rejected(criticality.Level, admission.Reason, bool) { r.n.Add(1) }
