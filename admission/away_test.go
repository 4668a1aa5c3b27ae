package admission_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
)

// A request waiting on a downstream call gives its execution slot to the
// next waiter until it is back, still counts among the requests the task
// holds, and its time away is not service time.
func TestAwayGivesTheSlotToTheNextRequest(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 1, 1), admission.WithMaxWait(time.Hour), admission.WithInterval(time.Second))
	var a, b admission.Ticket
	if err := c.Arrive(&a, criticality.Critical, 0, time.Time{}, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), &a); err != nil {
		t.Fatal(err)
	}
	if err := c.Arrive(&b, criticality.Sheddable, 0, time.Time{}, 0); err != nil {
		t.Fatal(err)
	}
	got := start(c, context.Background(), &b)
	waitQueued(t, c, 1, f)
	f.Advance(10 * time.Millisecond)
	c.Away(&a) // a calls its downstream: b runs
	if err := <-got; err != nil {
		t.Fatalf("b: %v", err)
	}
	if s := c.Stats(); s.Executing != 1 || s.Away != 1 || s.Pending != 2 || s.Queued != 0 {
		t.Fatalf("a away, b running: %+v", s)
	}
	c.Away(&a) // a second Away does nothing
	f.Advance(500 * time.Millisecond)
	c.Back(&a) // past the limit: a finishes its work
	c.Back(&a)
	if s := c.Stats(); s.Executing != 2 || s.Away != 0 || s.Pending != 2 {
		t.Fatalf("a back: %+v", s)
	}
	f.Advance(10 * time.Millisecond)
	c.Done(&a)
	c.Done(&b)
	if s := c.Stats(); s.Executing != 0 || s.Away != 0 || s.Pending != 0 {
		t.Fatalf("after Done: %+v", s)
	}
	// Done while away gives back nothing twice.
	var d admission.Ticket
	c.Arrive(&d, criticality.Critical, 0, time.Time{}, 0)
	c.Start(context.Background(), &d)
	c.Away(&d)
	c.Done(&d)
	c.Back(&d) // after Done: nothing
	if s := c.Stats(); s.Executing != 0 || s.Away != 0 || s.Pending != 0 {
		t.Fatalf("after Done while away: %+v", s)
	}
	f.Advance(time.Second)
	var probe admission.Ticket
	c.Arrive(&probe, criticality.Critical, 0, time.Time{}, 0) // runs the adjustment
	c.Done(&probe)
	// a: 10 ms + 10 ms of its own work around 500 ms away; b: from its
	// slot at 10 ms to 520 ms; d: none (counted as 1 ns).
	if got, want := c.Stats().ServiceTime, (20*time.Millisecond+510*time.Millisecond+1)/3; got != want {
		t.Fatalf("service time %v, want %v", got, want)
	}
}

// A request whose client does not read its response gives its execution
// slot to the next waiter and takes no room until it is unstalled: many
// stalled requests do not fill the pending cap, and the time stalled is
// not service time.
func TestStallGivesTheSlotAndTheRoomBack(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 1, 1), admission.WithMaxWait(time.Hour), admission.WithInterval(time.Second))
	var a, b admission.Ticket
	if err := c.Arrive(&a, criticality.Critical, 0, time.Time{}, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), &a); err != nil {
		t.Fatal(err)
	}
	if err := c.Arrive(&b, criticality.Critical, 0, time.Time{}, 0); err != nil {
		t.Fatal(err)
	}
	got := start(c, context.Background(), &b)
	waitQueued(t, c, 1, f)
	f.Advance(10 * time.Millisecond)
	c.Stall(&a) // a's client stops reading: b runs
	if err := <-got; err != nil {
		t.Fatalf("b: %v", err)
	}
	if s := c.Stats(); s.Executing != 1 || s.Stalled != 1 || s.Pending != 1 || s.Queued != 0 || s.Away != 0 {
		t.Fatalf("a stalled, b running: %+v", s)
	}
	c.Stall(&a) // a second Stall does nothing
	c.Away(&a)  // nor does Away while stalled
	c.Back(&a)
	if s := c.Stats(); s.Executing != 1 || s.Stalled != 1 || s.Pending != 1 || s.Away != 0 {
		t.Fatalf("a stalled twice: %+v", s)
	}
	// Stalled requests take no room: with the cap at its floor, 50 more
	// CRITICAL requests stalled after b still leave room for the next.
	stalled := make([]admission.Ticket, 50)
	for i := range stalled {
		c.Done(&b)
		b = admission.Ticket{}
		if err := c.Arrive(&stalled[i], criticality.Critical, 0, time.Time{}, 0); err != nil {
			t.Fatalf("request %d after %d stalled: %v", i, i, err)
		}
		if err := c.Start(context.Background(), &stalled[i]); err != nil {
			t.Fatal(err)
		}
		c.Stall(&stalled[i])
	}
	if s := c.Stats(); s.Executing != 0 || s.Stalled != 51 || s.Pending != 0 {
		t.Fatalf("51 stalled: %+v", s)
	}
	f.Advance(500 * time.Millisecond)
	c.Unstall(context.Background(), &a) // its client reads again: a takes its slot back
	c.Unstall(context.Background(), &a)
	if s := c.Stats(); s.Executing != 1 || s.Stalled != 50 || s.Pending != 1 {
		t.Fatalf("a unstalled: %+v", s)
	}
	for i := range stalled {
		c.Done(&stalled[i]) // ends while stalled: its client went away
	}
	f.Advance(10 * time.Millisecond)
	c.Done(&a)
	c.Unstall(context.Background(), &a) // after Done: nothing
	if s := c.Stats(); s.Executing != 0 || s.Stalled != 0 || s.Pending != 0 {
		t.Fatalf("after Done: %+v", s)
	}
	f.Advance(time.Second)
	var probe admission.Ticket
	c.Arrive(&probe, criticality.Critical, 0, time.Time{}, 0) // runs the adjustment
	c.Done(&probe)
	// a: 10 ms + 10 ms of its own work around 500 ms stalled; b and the
	// stalled ones: none (1 ns each).
	if got, want := c.Stats().ServiceTime, (20*time.Millisecond+51)/52; got != want {
		t.Fatalf("service time %v, want %v", got, want)
	}
}

// A stalled request coming back (Unstall) waits for a slot, never past
// the limit, ahead of the requests already queued; its context bounds the
// wait; and at most WithMaxStalled requests are stalled at once.
func TestUnstallWaitsForASlotAheadOfNewRequests(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 1, 1), admission.WithMaxWait(time.Hour),
		admission.WithInterval(time.Hour), admission.WithMaxStalled(1))
	var a, b, q, x admission.Ticket
	for _, tk := range []*admission.Ticket{&a, &b} {
		if err := c.Arrive(tk, criticality.Critical, 0, time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Start(context.Background(), &a); err != nil {
		t.Fatal(err)
	}
	if !c.Stall(&a) {
		t.Fatal("a did not stall")
	}
	if err := c.Start(context.Background(), &b); err != nil { // a's slot
		t.Fatal(err)
	}
	if c.Stall(&b) {
		t.Fatal("b stalled past WithMaxStalled(1)")
	}
	if err := c.Arrive(&q, criticality.CriticalPlus, 0, time.Time{}, 0); err != nil {
		t.Fatal(err)
	}
	queued := start(c, context.Background(), &q)
	waitQueued(t, c, 1, f)
	back := make(chan error, 1)
	go func() { back <- c.Unstall(context.Background(), &a) }()
	queuedReturns(t, c, 2)
	if s := c.Stats(); s.Executing != 1 || s.Stalled != 1 {
		t.Fatalf("a comes back while b runs: %+v, want it to wait, not exceed the limit", s)
	}
	c.Done(&b)
	if err := <-back; err != nil {
		t.Fatalf("a's return: %v", err)
	}
	select {
	case err := <-queued:
		t.Fatalf("q (CRITICAL_PLUS, queued first) got the slot before a came back: %v", err)
	default:
	}
	if s := c.Stats(); s.Executing != 1 || s.Stalled != 0 || s.Queued != 1 {
		t.Fatalf("a back: %+v", s)
	}
	c.Done(&a)
	if err := <-queued; err != nil {
		t.Fatal(err)
	}
	// A return whose context ends first stays stalled, holding no slot.
	if err := c.Arrive(&x, criticality.Critical, 0, time.Time{}, 0); err != nil {
		t.Fatal(err)
	}
	go func() { back <- c.Start(context.Background(), &x) }()
	waitQueued(t, c, 1, f)
	c.Stall(&q) // q stalls: x runs
	if err := <-back; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { back <- c.Unstall(ctx, &q) }()
	queuedReturns(t, c, 1)
	cancel()
	if err := <-back; !errors.Is(err, context.Canceled) {
		t.Fatalf("a return whose context ended: %v", err)
	}
	c.Done(&q)
	c.Done(&x)
	if s := c.Stats(); s.Executing != 0 || s.Stalled != 0 || s.Queued != 0 || s.Pending != 0 {
		t.Fatalf("after Done: %+v", s)
	}
}
