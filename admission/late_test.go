package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/testkit/loopback"
)

// Slow senders (issue 20): under SchedulerDelay, the time between Arrive
// and Start is the client's as much as the server's, so a request not
// started within four target delays is late: it stops holding room in the
// task, ranks below the fresh requests of its level, and past the message
// timeout is refused at Start.

func lateController(t *testing.T, f *clock.Fake, m admission.DelayMeasure) *admission.Controller {
	return mustNew(t, admission.WithClock(f), admission.WithDelayMeasure(m), admission.WithLimits(1, 1, 1),
		admission.WithInterval(time.Hour), admission.WithMaxWait(time.Minute))
}

// fill admits requests that never reach Start until the task refuses one,
// and returns how many it admitted.
func fill(t *testing.T, c *admission.Controller) int {
	t.Helper()
	for n := 0; n < 1000; n++ {
		var tk admission.Ticket
		if err := c.Arrive(&tk, criticality.Critical, 0, time.Time{}, 0); err != nil {
			if reason(t, err) != admission.Concurrency {
				t.Fatalf("refused for %v", err)
			}
			return n
		}
	}
	t.Fatal("the pending cap never refused")
	return 0
}

func TestRequestsWaitingForTheirMessageStopHoldingRoom(t *testing.T) {
	for _, tc := range []struct {
		m        admission.DelayMeasure
		admitted bool // after four target delays
	}{
		{admission.SchedulerDelay, true},
		{admission.ArrivalDelay, false}, // the wait is the server's queue: it still counts
	} {
		f := clock.NewFake(epoch)
		c := lateController(t, f, tc.m)
		if n := fill(t, c); n < 2 {
			t.Fatalf("%v: only %d admitted", tc.m, n)
		}
		f.Advance(admission.DefaultTargetDelay * 5)
		var tk admission.Ticket
		err := c.Arrive(&tk, criticality.Critical, 0, time.Time{}, 0)
		if got := err == nil; got != tc.admitted {
			t.Errorf("measure %v: a fresh request after five target delays: %v, want admitted %v", tc.m, err, tc.admitted)
		}
	}
}

func TestLateMessageIsRefusedAtStart(t *testing.T) {
	f := clock.NewFake(epoch)
	c := lateController(t, f, admission.SchedulerDelay)
	var tk admission.Ticket
	if err := c.Arrive(&tk, criticality.CriticalPlus, 0, time.Time{}, 0); err != nil {
		t.Fatal(err)
	}
	f.Advance(admission.DefaultMessageTimeout + time.Millisecond)
	err := c.Start(context.Background(), &tk)
	if err == nil || reason(t, err) != admission.Late {
		t.Fatalf("Start past the message timeout: %v, want a Late rejection", err)
	}
	c.Done(&tk)
	if s := c.Stats(); s.Pending != 0 || s.Executing != 0 {
		t.Fatalf("the refused request left %+v", s)
	}
	// Under ArrivalDelay the same wait is the server's own queue.
	c = lateController(t, f, admission.ArrivalDelay)
	if err := c.Arrive(&tk, criticality.CriticalPlus, 0, time.Time{}, 0); err != nil {
		t.Fatal(err)
	}
	f.Advance(admission.DefaultMessageTimeout + time.Millisecond)
	if err := c.Start(context.Background(), &tk); err != nil {
		t.Fatalf("ArrivalDelay: %v", err)
	}
	c.Done(&tk)
}

func TestLateRequestWaitsBehindFreshOnes(t *testing.T) {
	f := clock.NewFake(epoch)
	c := lateController(t, f, admission.SchedulerDelay)
	ctx := context.Background()
	var running, late, fresh admission.Ticket
	for _, tk := range []*admission.Ticket{&running, &late} {
		if err := c.Arrive(tk, criticality.Critical, 0, time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Start(ctx, &running); err != nil {
		t.Fatal(err)
	}
	f.Advance(5 * admission.DefaultTargetDelay) // late's message takes this long
	if err := c.Arrive(&fresh, criticality.Critical, 0, time.Time{}, 0); err != nil {
		t.Fatal(err)
	}
	lateDone := start(c, ctx, &late)
	waitQueued(t, c, 1, f)
	freshDone := start(c, ctx, &fresh)
	waitQueued(t, c, 2, f)
	c.Done(&running)
	if err := <-freshDone; err != nil {
		t.Fatalf("fresh: %v", err)
	}
	select {
	case err := <-lateDone:
		t.Fatalf("the late request took the slot before the fresh one (%v)", err)
	default:
	}
	c.Done(&fresh)
	if err := <-lateDone; err != nil {
		t.Fatalf("late, once the fresh one is done: %v", err)
	}
	c.Done(&late)
}

// A request whose goroutine has run (Scheduled) takes no room until
// Start, under either delay measure and with no time passing: the task
// admits any number of them, and each that then starts counts again. One
// that is never started, or is Done without Start, leaves every count at
// its baseline; Scheduled after Start, or twice, does nothing.
func TestScheduledRequestsTakeNoRoomUntilStart(t *testing.T) {
	for _, m := range []admission.DelayMeasure{admission.SchedulerDelay, admission.ArrivalDelay} {
		f := clock.NewFake(epoch)
		c := lateController(t, f, m)
		room := fill(t, c)
		f.Advance(admission.DefaultTargetDelay * 1000) // the filling requests age out under either measure
		waiting := make([]admission.Ticket, 3*room+10)
		for i := range waiting {
			if err := c.Arrive(&waiting[i], criticality.Critical, 0, time.Time{}, 0); err != nil {
				t.Fatalf("%v: request %d beside %d scheduled ones: %v", m, i, i, err)
			}
			c.Scheduled(&waiting[i])
			c.Scheduled(&waiting[i])
		}
		if p := c.Stats().Pending; p != 0 {
			t.Fatalf("%v: %d pending with %d requests scheduled and not started", m, p, len(waiting))
		}
		if err := c.Start(context.Background(), &waiting[0]); err != nil {
			t.Fatalf("%v: Start after Scheduled: %v", m, err)
		}
		c.Scheduled(&waiting[0])
		if s := c.Stats(); s.Pending != 1 || s.Executing != 1 {
			t.Fatalf("%v: after one Start, pending %d executing %d, want 1 and 1", m, s.Pending, s.Executing)
		}
		c.Done(&waiting[0])
		c.Done(&waiting[1]) // ended before Start
		if s := c.Stats(); s.Pending != 0 || s.Executing != 0 {
			t.Fatalf("%v: all done, pending %d executing %d", m, s.Pending, s.Executing)
		}
		// The rest are never started: the task's room is as it was.
		if n := fill(t, c); n != room {
			t.Fatalf("%v: %d admitted after, %d before: scheduled requests left counts behind", m, n, room)
		}
	}
}

// A request whose client is over its share (Arrive with OverShare) gets only
// the first half of the room; plain arrivals then still get the rest.
func TestOverShareGetsHalfTheRoom(t *testing.T) {
	room := fill(t, lateController(t, clock.NewFake(epoch), admission.SchedulerDelay))
	c := lateController(t, clock.NewFake(epoch), admission.SchedulerDelay)
	over := 0
	for ; over <= room; over++ {
		var tk admission.Ticket
		if err := c.Arrive(&tk, criticality.Critical, 0, time.Time{}, admission.OverShare); err != nil {
			if reason(t, err) != admission.Concurrency {
				t.Fatalf("refused for %v", err)
			}
			break
		}
	}
	if want := (room + 1) / 2; over != want {
		t.Fatalf("room %d: %d admitted over their share, want %d", room, over, want)
	}
	if n := fill(t, c); n != room-over {
		t.Fatalf("room %d, %d over share: %d more plain arrivals, want the rest", room, over, n)
	}
}

// A message the transport read while the request waited on its client
// (Scheduled, then Received: triagehttp's read-ahead of a body on a slow
// link) took the client's time, not the task's: the request is not late
// at Start however long the message took (issue 55), while the task's own
// delay before Scheduled still counts.
func TestReceivedMessageIsJudgedFromItsArrival(t *testing.T) {
	f := clock.NewFake(epoch)
	c := lateController(t, f, admission.SchedulerDelay)
	var tk admission.Ticket
	if err := c.Arrive(&tk, criticality.Critical, 0, time.Time{}, 0); err != nil {
		t.Fatal(err)
	}
	f.Advance(time.Millisecond)
	c.Scheduled(&tk)
	f.Advance(10 * admission.DefaultMessageTimeout) // the body trickles in
	c.Received(&tk)
	f.Advance(time.Millisecond)
	if err := c.Start(context.Background(), &tk); err != nil {
		t.Fatalf("Start after a slow message the transport read: %v, want a slot", err)
	}
	c.Done(&tk)

	if err := c.Arrive(&tk, criticality.Critical, 0, time.Time{}, 0); err != nil {
		t.Fatal(err)
	}
	f.Advance(admission.DefaultMessageTimeout + time.Millisecond) // the task's own delay
	c.Scheduled(&tk)
	c.Received(&tk)
	if err := c.Start(context.Background(), &tk); err == nil || reason(t, err) != admission.Late {
		t.Fatalf("Start after the task's own delay past the message timeout: %v, want Late", err)
	}
	c.Done(&tk)
}

// Requests over their share that took no room while they waited for
// their message (Scheduled) and then queue for a slot rank below the
// fresh requests of their level, as late ones do (issue 55): a plain
// request arriving when they fill the room takes one's place, and gets
// the next slot ahead of them.
func TestOverShareWaitersRankBelowFreshOnes(t *testing.T) {
	f := clock.NewFake(epoch)
	c := lateController(t, f, admission.SchedulerDelay)
	ctx := context.Background()
	var running admission.Ticket
	if err := c.Arrive(&running, criticality.Critical, 0, time.Time{}, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx, &running); err != nil {
		t.Fatal(err)
	}
	var over []<-chan error
	var overTickets []*admission.Ticket
	for n := 0; n < 100; n++ {
		tk := new(admission.Ticket)
		if err := c.Arrive(tk, criticality.Critical, 0, time.Time{}, admission.OverShare); err != nil {
			break
		}
		c.Scheduled(tk) // it waits for its message, holding no room
		ch := start(c, ctx, tk)
		refused := false
		loopback.WaitFor(t, "the request queued or refused", func() bool {
			select {
			case err := <-ch:
				refused = err != nil
				return true
			default:
				return c.Stats().Queued == int64(len(over)+1)
			}
		})
		if refused {
			break // the queue is full
		}
		over, overTickets = append(over, ch), append(overTickets, tk)
	}
	if len(over) < 2 {
		t.Fatalf("%d over their share queued", len(over))
	}
	var plain admission.Ticket
	if err := c.Arrive(&plain, criticality.Critical, 0, time.Time{}, 0); err != nil {
		t.Fatalf("a plain request beside %d over their share: %v, want admitted", len(over), err)
	}
	got := start(c, ctx, &plain)
	// It queued, taking the place of one over its share: that one is refused.
	loopback.WaitFor(t, "an over-share waiter displaced", func() bool {
		for i, ch := range over {
			select {
			case err := <-ch:
				if err == nil {
					t.Fatal("an over-share waiter got a slot")
				}
				over = append(over[:i], over[i+1:]...)
				overTickets = append(overTickets[:i], overTickets[i+1:]...)
				return true
			default:
			}
		}
		return false
	})
	c.Done(&running)
	if err := <-got; err != nil {
		t.Fatalf("the plain request's Start: %v, want the next slot", err)
	}
	c.Done(&plain)
	f.Advance(time.Hour) // the rest give up waiting: no goroutine left behind
	for i, ch := range over {
		if err := <-ch; err == nil {
			c.Done(overTickets[i]) // the one the plain request's slot went to
		}
	}
}
