package admission_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/outcome"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func mustNew(t testing.TB, opts ...admission.Option) *admission.Controller {
	t.Helper()
	c, err := admission.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// counter is an Observer that counts.
type counter struct {
	admitted int
	rejected map[admission.Reason]int
	dr       int
	limits   []int
	degraded int
}

func (o *counter) Observe(e admission.Event) {
	switch e.Kind {
	case admission.Admitted:
		o.admitted++
	case admission.Rejected:
		if o.rejected == nil {
			o.rejected = map[admission.Reason]int{}
		}
		o.rejected[e.Reason]++
		if e.DontRetry {
			o.dr++
		}
	case admission.LimitChanged:
		o.limits = append(o.limits, e.Limit)
	case admission.Degraded:
		o.degraded++
	}
}

func reason(t *testing.T, err error) admission.Reason {
	t.Helper()
	r, _, ok := admission.RejectionOf(err)
	if !ok {
		t.Fatalf("not a rejection: %v", err)
	}
	return r
}

func TestLimitBoundsExecution(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 2, 2))
	var a, b admission.Ticket
	for _, tk := range []*admission.Ticket{&a, &b} {
		if err := c.Arrive(tk, criticality.Critical, 0, time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
		if err := c.Start(context.Background(), tk); err != nil {
			t.Fatal(err)
		}
	}
	if s := c.Stats(); s.Executing != 2 || s.Pending != 2 {
		t.Fatalf("stats %+v", s)
	}
	c.Done(&a)
	c.Done(&a) // a second Done does nothing
	c.Done(&b)
	if s := c.Stats(); s.Executing != 0 || s.Pending != 0 {
		t.Fatalf("after Done: %+v", s)
	}
}

// start runs Start in a goroutine and returns a channel for its result.
func start(c *admission.Controller, ctx context.Context, tk *admission.Ticket) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- c.Start(ctx, tk) }()
	return ch
}

func waitQueued(t *testing.T, c *admission.Controller, n int64, f *clock.Fake) {
	t.Helper()
	stop := make(chan struct{})
	defer close(stop)
	// Every queued request holds one timer on the fake clock.
	if !f.BlockUntil(int(n), stop) {
		t.Fatal("requests did not queue")
	}
	if q := c.Stats().Queued; q != n {
		t.Fatalf("queued %d, want %d", q, n)
	}
}

type result struct {
	i   int
	err error
}

// A freed slot goes to the most critical waiter, oldest first.
func TestWaitersAreServedHighestCriticalityFirst(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 1, 1), admission.WithMaxWait(time.Hour))
	var running admission.Ticket
	c.Arrive(&running, criticality.Critical, 0, time.Time{}, 0)
	if err := c.Start(context.Background(), &running); err != nil {
		t.Fatal(err)
	}
	levels := []criticality.Level{criticality.Sheddable, criticality.CriticalPlus, criticality.SheddablePlus, criticality.CriticalPlus}
	tickets := make([]admission.Ticket, len(levels))
	done := make(chan result, len(levels))
	for i, l := range levels {
		if err := c.Arrive(&tickets[i], l, 0, time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
		go func() { done <- result{i, c.Start(context.Background(), &tickets[i])} }()
		waitQueued(t, c, int64(i+1), f)
	}
	var order []int
	prev := &running
	for range levels {
		c.Done(prev)
		var r result
		select {
		case r = <-done:
		case <-time.After(10 * time.Second): // a guard against a hang, not a wait
			t.Fatal("no waiter was given the freed slot")
		}
		if r.err != nil {
			t.Fatal(r.err)
		}
		order = append(order, r.i)
		prev = &tickets[r.i]
	}
	c.Done(prev)
	if want := []int{1, 3, 2, 0}; !equal(order, want) {
		t.Fatalf("served %v, want %v (CRITICAL_PLUS oldest first, then SHEDDABLE_PLUS, then SHEDDABLE)", order, want)
	}
	if s := c.Stats(); s.Pending != 0 || s.Executing != 0 || s.Queued != 0 {
		t.Fatalf("left over: %+v", s)
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A full queue: a more critical request displaces the oldest of the least
// critical waiters; an equally critical one is rejected.
func TestFullQueueDisplacesLowerCriticality(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 1, 1), admission.WithQueueFactor(0), admission.WithMaxWait(time.Hour))
	var running admission.Ticket
	c.Arrive(&running, criticality.Critical, 0, time.Time{}, 0)
	c.Start(context.Background(), &running)
	// Queue capacity is 0 x 1 + 8.
	tickets := make([]admission.Ticket, 9)
	done := make(chan result, 9)
	for i := 0; i < 8; i++ {
		if err := c.Arrive(&tickets[i], criticality.Sheddable, 0, time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
		go func() { done <- result{i, c.Start(context.Background(), &tickets[i])} }()
		waitQueued(t, c, int64(i+1), f)
	}
	// Another SHEDDABLE: no room, nobody below it.
	var extra admission.Ticket
	if err := c.Arrive(&extra, criticality.Sheddable, 0, time.Time{}, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background(), &extra); reason(t, err) != admission.Concurrency {
		t.Fatalf("err %v", err)
	}
	c.Done(&extra)
	// A CRITICAL takes the place of the oldest SHEDDABLE.
	if err := c.Arrive(&tickets[8], criticality.Critical, 0, time.Time{}, 0); err != nil {
		t.Fatal(err)
	}
	go func() { done <- result{8, c.Start(context.Background(), &tickets[8])} }()
	r := <-done
	if r.i != 0 || reason(t, r.err) != admission.Concurrency {
		t.Fatalf("displaced %d with %v, want the oldest SHEDDABLE (0)", r.i, r.err)
	}
	c.Done(&tickets[0])
	c.Done(&running)
	r = <-done
	if r.i != 8 || r.err != nil {
		t.Fatalf("the freed slot went to %d (%v), want the CRITICAL request", r.i, r.err)
	}
}

func TestWaitIsBoundedInTime(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 1, 1), admission.WithMaxWait(50*time.Millisecond))
	var running, waiting admission.Ticket
	c.Arrive(&running, criticality.Critical, 0, time.Time{}, 0)
	c.Start(context.Background(), &running)
	c.Arrive(&waiting, criticality.Critical, 0, time.Time{}, 0)
	ch := make(chan error, 1)
	go func() { ch <- c.Start(context.Background(), &waiting) }()
	waitQueued(t, c, 1, f)
	f.Advance(49 * time.Millisecond)
	select {
	case err := <-ch:
		t.Fatalf("gave up before the max wait: %v", err)
	default:
	}
	f.Advance(time.Millisecond)
	if err := <-ch; reason(t, err) != admission.Concurrency {
		t.Fatalf("err %v", err)
	}
	c.Done(&waiting)
	if s := c.Stats(); s.Queued != 0 || s.Pending != 1 {
		t.Fatalf("after the timeout: %+v", s)
	}
}

func TestCancelledWaiterLeavesTheQueue(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 1, 1), admission.WithMaxWait(time.Hour))
	var running, waiting admission.Ticket
	c.Arrive(&running, criticality.Critical, 0, time.Time{}, 0)
	c.Start(context.Background(), &running)
	c.Arrive(&waiting, criticality.Critical, 0, time.Time{}, 0)
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() { ch <- c.Start(ctx, &waiting) }()
	waitQueued(t, c, 1, f)
	cancel()
	if err := <-ch; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	c.Done(&waiting)
	c.Done(&running)
	if s := c.Stats(); s.Queued != 0 || s.Pending != 0 || s.Executing != 0 {
		t.Fatalf("left over: %+v", s)
	}
}

// Arrive bounds the pending requests. The cap starts at twice the limit
// plus the queue (here 10); more critical requests may go past it
// (SHEDDABLE_PLUS by 25%, CRITICAL by 200%, CRITICAL_PLUS by 400%, rounded
// up), and when even that is full they displace less critical requests
// that have not started yet: those are refused when they reach Start.
func TestArriveBoundsPendingByCriticality(t *testing.T) {
	c := mustNew(t, admission.WithLimits(1, 1, 1), admission.WithQueueFactor(0))
	type arrived struct {
		tk *admission.Ticket
		l  criticality.Level
	}
	var held []arrived
	admit := func(l criticality.Level) error {
		tk := &admission.Ticket{}
		err := c.Arrive(tk, l, 0, time.Time{}, 0)
		if err == nil {
			held = append(held, arrived{tk, l})
		}
		return err
	}
	for i := 0; i < 10; i++ {
		if err := admit(criticality.Sheddable); err != nil {
			t.Fatalf("arrival %d: %v", i, err)
		}
	}
	err := admit(criticality.Sheddable)
	if reason(t, err) != admission.Concurrency {
		t.Fatalf("SHEDDABLE at the cap: %v", err)
	}
	if oe, _ := outcome.As(err); oe.Kind != outcome.TaskOverloaded || oe.Local || oe.Downstream {
		t.Fatalf("rejection %#v", oe)
	}
	// CRITICAL_PLUS: 40 within its headroom (cap 50), then 10 more by
	// displacing the 10 SHEDDABLE, then no more.
	for i := 0; i < 50; i++ {
		if err := admit(criticality.CriticalPlus); err != nil {
			t.Fatalf("CRITICAL_PLUS %d: %v", i, err)
		}
	}
	if err := admit(criticality.CriticalPlus); reason(t, err) != admission.Concurrency {
		t.Fatalf("CRITICAL_PLUS with nothing left to displace: %v", err)
	}
	// The displaced SHEDDABLE are refused at Start; CRITICAL_PLUS run.
	refused := 0
	for _, a := range held {
		err := c.Start(context.Background(), a.tk)
		if err != nil {
			if a.l != criticality.Sheddable {
				t.Fatalf("%v refused at Start: %v", a.l, err)
			}
			refused++
		}
		c.Done(a.tk)
	}
	if refused != 10 {
		t.Fatalf("%d SHEDDABLE refused at Start, want 10", refused)
	}
	if s := c.Stats(); s.Pending != 0 {
		t.Fatalf("left: %+v", s)
	}
}

// Degrade says yes when the task is full, before anything is rejected.
func TestDegradeWhenFull(t *testing.T) {
	obs := &counter{}
	c := mustNew(t, admission.WithLimits(1, 1, 1), admission.WithQueueFactor(0), admission.WithObserver(obs))
	if c.Degrade(criticality.Critical) {
		t.Fatal("an idle task degrades")
	}
	var held []*admission.Ticket
	for float64(c.Stats().Pending) < c.Stats().PendingCap {
		tk := &admission.Ticket{}
		if err := c.Arrive(tk, criticality.Critical, 0, time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
		held = append(held, tk)
	}
	if !c.Degrade(criticality.Critical) || obs.degraded != 1 {
		t.Fatalf("a full task does not degrade (observer %d)", obs.degraded)
	}
	for _, tk := range held {
		c.Done(tk)
	}
}

// Overloaded is true for an interval after a rejection for load, and only
// then.
func TestOverloadedFollowsShedding(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 1, 1), admission.WithInterval(time.Second))
	if c.Overloaded() {
		t.Fatal("overloaded before any request")
	}
	tks := make([]admission.Ticket, 100)
	rejected := 0
	for i := range tks {
		if c.Arrive(&tks[i], criticality.Sheddable, 0, time.Time{}, 0) != nil {
			rejected++
		}
	}
	if rejected == 0 || !c.Overloaded() {
		t.Fatalf("%d rejected, overloaded %v", rejected, c.Overloaded())
	}
	f.Advance(1100 * time.Millisecond)
	if c.Overloaded() {
		t.Error("still overloaded an interval after the last rejection")
	}
}

// A request whose criticality has decayed (the CRE post: the front page is
// worthless after 2 s) ranks below fresh SHEDDABLE requests: a freed slot
// goes to the fresh one, and a full queue sheds the decayed one first.
func TestDecayedWaitersRankBelowFreshSheddable(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 1, 1), admission.WithQueueFactor(0), admission.WithMaxWait(time.Hour))
	var running admission.Ticket
	c.Arrive(&running, criticality.Critical, 0, time.Time{}, 0)
	if err := c.Start(context.Background(), &running); err != nil {
		t.Fatal(err)
	}
	frontPage := criticality.WithDecay(context.Background(), criticality.Decay{At: epoch.Add(2 * time.Second), To: criticality.Sheddable})
	tickets := make([]admission.Ticket, 10)
	done := make(chan result, 10)
	queue := func(i int, ctx context.Context, l criticality.Level) {
		t.Helper()
		if err := c.Arrive(&tickets[i], l, 0, time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
		go func() { done <- result{i, c.Start(ctx, &tickets[i])} }()
	}
	// 0 and 1: the front page (CRITICAL, decays at 2 s); 2: fresh SHEDDABLE.
	queue(0, frontPage, criticality.Critical)
	waitQueued(t, c, 1, f)
	queue(1, frontPage, criticality.Critical)
	waitQueued(t, c, 2, f)
	f.Advance(time.Second)
	queue(2, context.Background(), criticality.Sheddable)
	waitQueued(t, c, 3, f)
	// Before the decay, the front page is served before SHEDDABLE.
	c.Done(&running)
	if r := <-done; r.i != 0 || r.err != nil {
		t.Fatalf("before the decay the slot went to %d (%v), want the front page (0)", r.i, r.err)
	}
	// At 2 s, request 1 decays: it moves behind the fresh SHEDDABLE (its
	// first timer fired, a second one is set: still three timers).
	f.Advance(time.Second)
	waitQueued(t, c, 2, f)
	c.Done(&tickets[0])
	if r := <-done; r.i != 2 || r.err != nil {
		t.Fatalf("after the decay the slot went to %d (%v), want the fresh SHEDDABLE (2)", r.i, r.err)
	}
	// Fill the queue (capacity 8) with fresh SHEDDABLE: the 8th arrival
	// finds it full and displaces the decayed request, not a fresh one.
	for i := 3; i < 10; i++ {
		queue(i, context.Background(), criticality.Sheddable)
		if i < 9 {
			waitQueued(t, c, int64(i-1), f)
		}
	}
	r := <-done
	if r.i != 1 || reason(t, r.err) != admission.Concurrency {
		t.Fatalf("a full queue shed %d (%v), want the decayed front page (1)", r.i, r.err)
	}
	c.Done(&tickets[1])
	// The rest are served oldest first.
	c.Done(&tickets[2])
	if r := <-done; r.i != 3 || r.err != nil {
		t.Fatalf("freed slot went to %d (%v), want the oldest fresh SHEDDABLE (3)", r.i, r.err)
	}
}

// queuedReturns waits until n requests are queued; a stalled request
// coming back waits with no timer, so the fake clock cannot tell.
func queuedReturns(t *testing.T, c *admission.Controller, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for c.Stats().Queued != n {
		if time.Now().After(deadline) {
			t.Fatalf("queued %d, want %d", c.Stats().Queued, n)
		}
		runtime.Gosched()
	}
}

// waits records the waits of the Admitted events an Observer is told.
type waits struct {
	mu sync.Mutex
	d  []time.Duration
}

func (w *waits) Observe(e admission.Event) {
	if e.Kind != admission.Admitted {
		return
	}
	w.mu.Lock()
	w.d = append(w.d, e.Wait)
	w.mu.Unlock()
}

// An Observer learns each admitted request's wait
// for its slot: 0 for one that got it at once, the time it queued for
// one that waited (on the fake clock).
func TestObserverLearnsTheQueueWait(t *testing.T) {
	f := clock.NewFake(epoch)
	w := &waits{}
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 1, 1), admission.WithMaxWait(time.Hour), admission.WithObserver(w))
	var first, second admission.Ticket
	c.Arrive(&first, criticality.Critical, 0, time.Time{}, 0)
	if err := c.Start(context.Background(), &first); err != nil {
		t.Fatal(err)
	}
	c.Arrive(&second, criticality.Critical, 0, time.Time{}, 0)
	done := make(chan error, 1)
	go func() { done <- c.Start(context.Background(), &second) }()
	waitQueued(t, c, 1, f)
	f.Advance(30 * time.Millisecond)
	c.Done(&first)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c.Done(&second)
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.d) != 2 || w.d[0] != 0 || w.d[1] != 30*time.Millisecond {
		t.Fatalf("waits %v, want [0 30ms]", w.d)
	}
}

// givesUpAt checks that the request whose Start reports to errc is
// refused for want of a slot d from now, not before.
func givesUpAt(t *testing.T, f *clock.Fake, errc <-chan error, d time.Duration, what string) {
	t.Helper()
	f.Advance(d - time.Millisecond)
	select {
	case err := <-errc:
		t.Fatalf("%s gave up before %v: %v", what, d, err)
	default:
	}
	f.Advance(time.Millisecond)
	select {
	case err := <-errc:
		if reason(t, err) != admission.Concurrency {
			t.Fatalf("%s: err %v", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s still waiting after %v; the max wait is 1 s", what, d)
	}
}
