package admission

import (
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
)

// fakeDelay is a queueing delay set by the test.
type fakeDelay struct{ d time.Duration }

func (f *fakeDelay) read() (time.Duration, uint64) { return f.d, 1 }

// A net/http server on one CPU holds its excess in Go's run queue, where
// no pending count sees it: every request reaching Arrive finds the task
// idle. Requests that say so (RunQueued) are shed by the queueing delay
// instead: SHEDDABLE first, CRITICAL_PLUS last, more each interval while
// the delay is over the target, less while it is under. Others are not
// gated.
func TestRunQueuedArrivalsShedByCriticality(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	draws := 0
	c, err := New(WithClock(clk), WithRandom(func() float64 {
		draws++
		return float64(draws%100) / 100
	}))
	if err != nil {
		t.Fatal(err)
	}
	delay := &fakeDelay{}
	c.sched = delay
	shed := func(l criticality.Level, a Arrival) float64 {
		refused := 0
		for range 200 {
			var tk Ticket
			if err := c.ArriveAs(&tk, l, 0, time.Time{}, a); err != nil {
				if r, _, _ := RejectionOf(err); r != Queue {
					t.Fatalf("%v refused for %v, want %v", l, r, Queue)
				}
				refused++
				continue
			}
			if err := c.Start(t.Context(), &tk); err != nil {
				t.Fatal(err)
			}
			c.Done(&tk)
		}
		return float64(refused) / 200
	}
	interval := func(d time.Duration) {
		delay.d = d
		clk.Advance(DefaultInterval)
		shed(criticality.CriticalPlus, 0) // an arrival runs the adjustment
	}
	for l := range criticality.NumLevels {
		if got := shed(criticality.Level(l), RunQueued); got != 0 {
			t.Fatalf("no delay: %v shed %.2f", criticality.Level(l), got)
		}
	}
	// 300 ms in the run queue, 60 times the target: SHEDDABLE and
	// SHEDDABLE_PLUS go at once, CRITICAL by quarters.
	interval(300 * time.Millisecond)
	interval(300 * time.Millisecond)
	interval(300 * time.Millisecond)
	want := [criticality.NumLevels]float64{1, 1, 0.25, 0}
	for l, w := range want {
		if got := shed(criticality.Level(l), RunQueued); got < w-0.05 || got > w+0.05 {
			t.Errorf("after three intervals at 60x the target: %v shed %.2f, want %.2f", criticality.Level(l), got, w)
		}
	}
	if got := shed(criticality.Sheddable, 0); got != 0 {
		t.Errorf("an arrival the transport counts (not RunQueued) was shed by the gate: %.2f", got)
	}
	// Under the target the gate eases in proportion: CRITICAL first
	// comes back, CRITICAL_PLUS was never touched.
	interval(4 * time.Millisecond) // 0.8x: a twentieth of a level
	if s := c.Stats().QueueShed; s[criticality.Critical] < 0.15 || s[criticality.Critical] > 0.25 || s[criticality.SheddablePlus] != 1 {
		t.Errorf("at 0.8x the target: %v, want CRITICAL shed a little less", s)
	}
	interval(time.Millisecond) // 0.2x: a fifth of a level
	if s := c.Stats().QueueShed; s[0] != 1 || s[1] != 1 || s[2] > 0.001 || s[3] != 0 {
		t.Errorf("after an interval at a fifth of the target: %v, want CRITICAL back first", s)
	}
	for range 40 {
		interval(time.Millisecond)
	}
	if s := c.Stats().QueueShed; s != [4]float64{} {
		t.Errorf("after 40 intervals under the target, still shedding: %v", s)
	}
}

// The run queue's waits through a pause of the process (SIGSTOP) are the
// pause's: the goroutines runnable when it began ran seconds later. The
// interval's reading that spans a pause is left out, so that it neither
// shrinks the pending cap nor refuses requests for their deadlines.
func TestSchedulerDelayOfAPauseIsLeftOut(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	c, err := New(WithClock(clk), WithRandom(func() float64 { return 0.5 }))
	if err != nil {
		t.Fatal(err)
	}
	delay := &fakeDelay{d: time.Millisecond}
	c.sched = delay
	serve := func() {
		var tk Ticket
		if err := c.Arrive(&tk, criticality.Critical, 0, clk.Now().Add(time.Second)); err != nil {
			t.Fatalf("at %v: %v (queue delay %v)", clk.Now(), err, c.Stats().QueueDelay)
		}
		if err := c.Start(t.Context(), &tk); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Millisecond)
		c.Done(&tk)
	}
	for range 10 {
		clk.Advance(DefaultInterval)
		serve()
	}
	capBefore := c.Stats().PendingCap
	clk.Advance(5 * time.Second) // the pause
	delay.d = 5 * time.Second    // what the run queue saw through it
	serve()
	delay.d = time.Millisecond
	if s := c.Stats(); s.QueueDelay > 10*time.Millisecond || s.PendingCap < capBefore {
		t.Errorf("after the pause: queue delay %v, pending cap %v (before %v)", s.QueueDelay, s.PendingCap, capBefore)
	}
	clk.Advance(DefaultInterval)
	serve()
}
