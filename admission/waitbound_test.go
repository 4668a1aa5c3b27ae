package admission_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
)

// With WithMaxWaitServiceTimes, the wait for a slot is bounded by that
// many of the last measured mean service times once the slot queue has
// stood a whole interval: a request that arrives then waits at most the
// bound, and one queued before, in what looked like a burst, gives up at
// its next look (at its bound, then every interval) when it has waited
// past the bound (CoDel's rule: a burst that drains is not refused, a
// queue that stands is bounded). A burst that drains waits as long as it
// needs. CRITICAL and CRITICAL_PLUS requests wait three times as long,
// and the max wait bounds all. An idle spell does not lift the bound: a
// burst after ten seconds without a request is bounded by the service
// time measured before them (the sidecar's step from idle to 10x held the
// requests of its first interval up to the max wait, a second).
func TestWaitIsBoundedInServiceTimes(t *testing.T) {
	const svc, interval = 20 * time.Millisecond, 100 * time.Millisecond
	for _, tc := range []struct {
		level criticality.Level
		times time.Duration // service times
	}{{criticality.Sheddable, 2}, {criticality.SheddablePlus, 2}, {criticality.Critical, 6}, {criticality.CriticalPlus, 6}} {
		for _, idle := range []time.Duration{0, 10 * time.Second} {
			what := fmt.Sprintf("%v after %v idle", tc.level, idle)
			bound := tc.times * svc
			// warmed is a controller that served 400 ms of 20 ms requests,
			// one at a time (four intervals), then was idle.
			warmed := func() (*clock.Fake, *admission.Controller) {
				f, c := served(t, 2)
				f.Advance(idle)
				return f, c
			}

			// A burst that drains: served after 150 ms, past its bound.
			f, c := warmed()
			running := occupy(t, c)
			drains, drainsErr := queue(t, c, f, tc.level, 1)
			walk(t, f, interval, 1)
			tick(c) // the interval ends in which the queue emptied
			walk(t, f, 50*time.Millisecond, 1)
			c.Done(running)
			if err := <-drainsErr; err != nil {
				t.Fatalf("%s, in a burst that drains: %v after 150 ms, want the slot", what, err)
			}
			c.Done(drains)

			// A burst that stands: its request gives up at its first look
			// after an interval in which the queue never emptied.
			f, c = warmed()
			t0 := f.Now()
			running = occupy(t, c)
			burst, burstErr := queue(t, c, f, tc.level, 1)
			walk(t, f, interval, 1)
			tick(c) // the interval ends in which the queue emptied (running started from it)
			walk(t, f, interval, 1)
			tick(c) // one in which it never did
			walk(t, f, 10*time.Millisecond, 1)
			second, secondErr := queue(t, c, f, tc.level, 2) // arrives to a standing queue
			look := bound
			for look < 2*interval {
				look += interval
			}
			givesUpAt(t, f, burstErr, look-f.Now().Sub(t0), what+", queued in a burst that stood")
			c.Done(burst)
			givesUpAt(t, f, secondErr, t0.Add(2*interval+10*time.Millisecond+bound).Sub(f.Now()), what+", arriving to a standing queue")
			c.Done(second)
			c.Done(running)
		}
	}
}

// Before a service time is measured, WithMaxWaitServiceTimes' requests
// look again every interval: once one is, in a queue that stood a whole
// interval, a request that waited past the bound gives up (a sidecar
// started into 10x held the requests of its first interval up to the
// max wait, a second).
func TestWaitIsBoundedOnceAServiceTimeIsMeasured(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 1, 1), admission.WithMaxWait(time.Second),
		admission.WithMaxWaitServiceTimes(1), admission.WithInterval(100*time.Millisecond))
	running := occupy(t, c)
	first, firstErr := queue(t, c, f, criticality.Sheddable, 1)
	second, secondErr := queue(t, c, f, criticality.Sheddable, 2)
	f.Advance(30 * time.Millisecond)
	c.Done(running) // 30 ms: the service time; first takes the slot
	if err := <-firstErr; err != nil {
		t.Fatal(err)
	}
	walk(t, f, 70*time.Millisecond, 1)
	tick(c) // measures the service time; the queue emptied in this interval
	walk(t, f, 100*time.Millisecond, 1)
	tick(c) // it never did in this one
	givesUpAt(t, f, secondErr, 100*time.Millisecond, "a request queued before a service time")
	c.Done(second)
	c.Done(first)
}

// served is a controller with one slot, a 1 s max wait,
// WithMaxWaitServiceTimes(n) and a 100 ms interval, that served 400 ms of
// 20 ms requests one at a time (four intervals).
func served(t *testing.T, n float64) (*clock.Fake, *admission.Controller) {
	t.Helper()
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 1, 1), admission.WithMaxWait(time.Second),
		admission.WithMaxWaitServiceTimes(n), admission.WithInterval(100*time.Millisecond))
	for range 20 {
		tk := occupy(t, c)
		f.Advance(20 * time.Millisecond)
		c.Done(tk)
	}
	return f, c
}

// stand queues a level-l request, the n-th waiting, and lets its level's
// queue stand a whole 100 ms interval (the one it queued in emptied).
func stand(t *testing.T, f *clock.Fake, c *admission.Controller, l criticality.Level, n int64) (*admission.Ticket, <-chan error) {
	t.Helper()
	tk, errc := queue(t, c, f, l, n)
	walk(t, f, 100*time.Millisecond, int(n))
	tick(c)
	walk(t, f, 100*time.Millisecond, int(n))
	tick(c)
	return tk, errc
}

// occupy admits a CRITICAL request that takes the free slot.
func occupy(t *testing.T, c *admission.Controller) *admission.Ticket {
	t.Helper()
	tk := new(admission.Ticket)
	c.Arrive(tk, criticality.Critical, 0, time.Time{}, 0)
	if err := c.Start(context.Background(), tk); err != nil {
		t.Fatal(err)
	}
	return tk
}

// queue starts a request of level l that waits for a slot, the n-th in
// the queue; its Start reports to the channel.
func queue(t *testing.T, c *admission.Controller, f *clock.Fake, l criticality.Level, n int64) (*admission.Ticket, <-chan error) {
	t.Helper()
	tk := new(admission.Ticket)
	c.Arrive(tk, l, 0, time.Time{}, 0)
	errc := start(c, context.Background(), tk)
	waitQueued(t, c, n, f)
	return tk, errc
}

// walk advances f by d a millisecond at a time, each step once the n
// waiting requests have their timers (a request that looks again sets a
// new one), so that each looks at the time it meant to. It fails if they
// do not within 10 s of real time (one of them left).
func walk(t *testing.T, f *clock.Fake, d time.Duration, n int) {
	t.Helper()
	stop := make(chan struct{})
	defer time.AfterFunc(10*time.Second, func() { close(stop) }).Stop()
	for range d / time.Millisecond {
		f.Advance(time.Millisecond)
		if !f.BlockUntil(n, stop) {
			t.Fatal("a waiting request left")
		}
	}
}

// tick is an arrival that leaves at once: the controller revisits its
// state as each interval ends, on the first arrival after it.
func tick(c *admission.Controller) {
	var tk admission.Ticket
	c.Arrive(&tk, criticality.Critical, 0, time.Time{}, 0)
	c.Done(&tk)
}

// With WithMaxWaitServiceTimes, a queue that stands serves its newest
// request first (adaptive LIFO, with CoDel's rule the pair of "Fail at
// Scale"): the older ones give up at their bound either way, and the
// requests served have waited little instead of about the bound each. A
// burst that drains is served oldest first.
func TestStandingQueueServesTheNewestFirst(t *testing.T) {
	const svc, interval = 20 * time.Millisecond, 100 * time.Millisecond
	for _, l := range []criticality.Level{criticality.Sheddable, criticality.Critical} {
		f, c := served(t, 2)

		// A burst: the oldest first.
		running := occupy(t, c)
		first, firstErr := queue(t, c, f, l, 1)
		second, secondErr := queue(t, c, f, l, 2)
		c.Done(running)
		if err := <-firstErr; err != nil {
			t.Fatalf("%v, in a burst: the first queued got %v, want the slot", l, err)
		}
		c.Done(first)
		if err := <-secondErr; err != nil {
			t.Fatalf("%v, in a burst: the second queued got %v, want the slot", l, err)
		}

		// A queue that stands: the newest first.
		running = second
		older, olderErr := stand(t, f, c, l, 1)
		walk(t, f, 10*time.Millisecond, 1)
		newer, newerErr := queue(t, c, f, l, 2)
		c.Done(running)
		select {
		case err := <-newerErr:
			if err != nil {
				t.Fatalf("%v, in a standing queue: the newest got %v, want the slot", l, err)
			}
		case err := <-olderErr:
			t.Fatalf("%v, in a standing queue: the oldest got the slot (%v) before the newest", l, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("%v: nobody got the freed slot", l)
		}
		f.Advance(interval) // past the older one's next look
		select {
		case err := <-olderErr:
			if err == nil || reason(t, err) != admission.Concurrency {
				t.Fatalf("%v, in a standing queue: the oldest got %v, want to give up", l, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%v, in a standing queue: the oldest still waits past its bound", l)
		}
		c.Done(older)
		c.Done(newer)
	}
}

// Adaptive LIFO is per level: while SHEDDABLE's queue stands, CRITICAL
// requests, which the slots keep up with, are served in order (served
// newest first, the ones that waited longest would wait out their bound
// at a level that all fits).
func TestOnlyALevelWhoseQueueStandsIsServedNewestFirst(t *testing.T) {
	f, c := served(t, 2)
	running := occupy(t, c)
	stands, standsErr := stand(t, f, c, criticality.Sheddable, 1)
	first, firstErr := queue(t, c, f, criticality.Critical, 2)
	second, secondErr := queue(t, c, f, criticality.Critical, 3)
	c.Done(running)
	select {
	case err := <-firstErr:
		if err != nil {
			t.Fatalf("the first CRITICAL request got %v, want the slot", err)
		}
	case err := <-secondErr:
		t.Fatalf("the second CRITICAL request got the slot (%v) before the first: its level's queue did not stand", err)
	case <-time.After(10 * time.Second):
		t.Fatal("nobody got the freed slot")
	}
	c.Done(first)
	if err := <-secondErr; err != nil {
		t.Fatalf("the second CRITICAL request: %v, want the slot", err)
	}
	f.Advance(100 * time.Millisecond)
	if err := <-standsErr; err == nil || reason(t, err) != admission.Concurrency {
		t.Fatalf("the standing SHEDDABLE request: %v, want to give up", err)
	}
	c.Done(second)
	c.Done(stands)
}

// WithMaxWaitServiceTimes' bound applies to a level whose own queue
// stands: while SHEDDABLE's does, a CRITICAL_PLUS request, whose level
// the slots keep up with, waits past its bound for the next slot (the
// sidecar at 10x refused CRITICAL_PLUS requests at their bound, which fit
// in the upstream's capacity, because the SHEDDABLE queue stood).
func TestBoundAppliesToALevelWhoseQueueStands(t *testing.T) {
	f, c := served(t, 1) // CRITICAL_PLUS's bound: 60 ms
	running := occupy(t, c)
	stands, standsErr := stand(t, f, c, criticality.Sheddable, 1)
	givesUpAt(t, f, standsErr, 20*time.Millisecond, "the standing SHEDDABLE request")
	c.Done(stands)
	critical, criticalErr := queue(t, c, f, criticality.CriticalPlus, 1) // its own queue is empty
	for i := range 90 {
		f.Advance(time.Millisecond)
		stop, looked := make(chan struct{}), make(chan bool, 1)
		go func() { looked <- f.BlockUntil(1, stop) }()
		select {
		case err := <-criticalErr:
			close(stop)
			t.Fatalf("the CRITICAL_PLUS request after %d ms: %v, want to wait for the slot", i+1, err)
		case <-looked:
		}
	}
	c.Done(running)
	select {
	case err := <-criticalErr:
		if err != nil {
			t.Fatalf("the CRITICAL_PLUS request after 90 ms: %v, want the slot", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nobody got the freed slot")
	}
	c.Done(critical)
}
