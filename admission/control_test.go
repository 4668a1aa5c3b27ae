package admission_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/outcome"
)

// fixed is a Signal with a settable value.
type fixed struct{ u float64 }

func (f *fixed) Name() string         { return "fixed" }
func (f *fixed) Utilization() float64 { return f.u }

// As a signal rises, SHEDDABLE is shed first and progressively,
// CRITICAL_PLUS last.
func TestSignalShedsLowerCriticalityFirstAndProgressively(t *testing.T) {
	sig := &fixed{}
	rng := rand.New(rand.NewPCG(1, 1))
	c := mustNew(t, admission.WithSignal(sig, admission.DefaultThresholds()), admission.WithRandom(rng.Float64))
	share := func(l criticality.Level) float64 {
		rejected := 0
		for i := 0; i < 2000; i++ {
			var tk admission.Ticket
			if err := c.Arrive(&tk, l, 0, time.Time{}, 0); err != nil {
				if reason(t, err) != admission.Utilization {
					t.Fatalf("reason %v", err)
				}
				rejected++
				continue
			}
			c.Done(&tk)
		}
		return float64(rejected) / 2000
	}
	for _, tc := range []struct {
		u    float64
		want [criticality.NumLevels]float64
	}{
		{0.70, [4]float64{0, 0, 0, 0}},
		{0.85, [4]float64{0.5, 0, 0, 0}},
		{0.92, [4]float64{1, 0.7, 0.2, 0}},
		{1.00, [4]float64{1, 1, 1, 0.5}},
		{1.10, [4]float64{1, 1, 1, 1}},
	} {
		sig.u = tc.u
		for l := criticality.Level(0); l < criticality.NumLevels; l++ {
			if got := share(l); math.Abs(got-tc.want[l]) > 0.05 {
				t.Errorf("utilization %.2f, %v: rejected %.2f, want %.2f", tc.u, l, got, tc.want[l])
			}
		}
	}
}

// A task paused for seconds (SIGSTOP, a stalled VM) finishes the
// requests it held with seconds of service time; every request after it
// has a shorter deadline, and was refused for it before it ran, so no
// new service time was measured and the task refused everything for
// good. An interval without a measurement is no evidence: the expected
// service time halves, and requests are admitted again within a second.
func TestStaleServiceTimeDoesNotRefuseForever(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(4, 4, 4))
	var held [4]admission.Ticket
	for i := range held {
		c.Arrive(&held[i], criticality.Critical, 0, time.Time{}, 0)
		c.Start(context.Background(), &held[i])
	}
	f.Advance(10 * time.Second) // the pause
	for i := range held {
		c.Done(&held[i])
	}
	admittedAt := time.Duration(-1)
	for step := time.Duration(0); step <= 3*time.Second; step += 10 * time.Millisecond {
		var tk admission.Ticket
		err := c.Arrive(&tk, criticality.Critical, 0, f.Now().Add(time.Second), 0)
		if err == nil {
			admittedAt = step
			c.Done(&tk)
			break
		}
		if reason(t, err) != admission.Deadline {
			t.Fatalf("refused for %v", err)
		}
		f.Advance(10 * time.Millisecond)
	}
	if admittedAt < 0 || admittedAt > time.Second {
		t.Fatalf("a request with a 1 s deadline admitted %v after the pause, want within 1 s (-1: never in 3 s); service time %v", admittedAt, c.Stats().ServiceTime)
	}
}

// A pause of the whole process (SIGSTOP, a frozen VM) is not service
// time: the requests it held finish just after it with the pause in their
// clocks. Counted as service, the pause made the task refuse every fresh
// request with a deadline, CRITICAL_PLUS included, for the interval after
// it, and the refusals reached the top of the stack (the fault matrix's
// storm: a DB tier stopped for 5 s, then 1.7 s of expected service for a
// 20 ms call). Time in which the Controller saw nothing at all happen,
// far longer than its requests take, is left out of what it measures.
func TestPauseOfTheProcessIsNotServiceTime(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(4, 4, 4))
	for i := 0; i < 50; i++ { // a 20 ms service
		var tk admission.Ticket
		c.Arrive(&tk, criticality.Critical, 0, time.Time{}, 0)
		c.Start(context.Background(), &tk)
		f.Advance(20 * time.Millisecond)
		c.Done(&tk)
	}
	var held [4]admission.Ticket
	for i := range held {
		c.Arrive(&held[i], criticality.Critical, 0, time.Time{}, 0)
		c.Start(context.Background(), &held[i])
	}
	var waiting admission.Ticket // arrived, not started: its delay is measured
	c.Arrive(&waiting, criticality.Critical, 0, time.Time{}, 0)
	f.Advance(10 * time.Millisecond)
	f.Advance(5 * time.Second) // the pause
	f.Advance(10 * time.Millisecond)
	for i := range held {
		c.Done(&held[i])
	}
	c.Scheduled(&waiting)
	c.Done(&waiting)
	for _, l := range []criticality.Level{criticality.CriticalPlus, criticality.Critical, criticality.Sheddable} {
		var tk admission.Ticket
		if err := c.Arrive(&tk, l, 0, f.Now().Add(time.Second), 0); err != nil {
			t.Errorf("%v with a 1 s deadline just after the pause: %v (service time %v, queue delay %v)", l, err, c.Stats().ServiceTime, c.Stats().QueueDelay)
			continue
		}
		c.Done(&tk)
	}
	if s := c.Stats(); s.ServiceTime > 100*time.Millisecond || s.QueueDelay > 100*time.Millisecond {
		t.Errorf("after the pause: service time %v, queue delay %v; want the 20 ms and 10 ms the requests took while the process ran", s.ServiceTime, s.QueueDelay)
	}
}

func TestDeadlineTooCloseIsRejectedAtOnce(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithInterval(time.Second))
	// Teach it a 100 ms service time.
	for i := 0; i < 10; i++ {
		var tk admission.Ticket
		c.Arrive(&tk, criticality.Critical, 0, time.Time{}, 0)
		c.Start(context.Background(), &tk)
		f.Advance(100 * time.Millisecond)
		c.Done(&tk)
	}
	f.Advance(time.Second)
	var probe admission.Ticket
	c.Arrive(&probe, criticality.Critical, 0, time.Time{}, 0) // runs the adjustment
	c.Done(&probe)
	if got := c.Stats().ServiceTime; got != 100*time.Millisecond {
		t.Fatalf("service time %v", got)
	}
	var tk admission.Ticket
	if err := c.Arrive(&tk, criticality.CriticalPlus, 0, f.Now().Add(50*time.Millisecond), 0); reason(t, err) != admission.Deadline {
		t.Fatalf("a 50 ms deadline for a 100 ms request: %v", err)
	}
	if err := c.Arrive(&tk, criticality.CriticalPlus, 0, f.Now().Add(-time.Millisecond), 0); reason(t, err) != admission.Deadline {
		t.Fatalf("an expired deadline: %v", err)
	}
	if err := c.Arrive(&tk, criticality.Sheddable, 0, f.Now().Add(time.Second), 0); err != nil {
		t.Fatalf("a 1 s deadline: %v", err)
	}
	c.Done(&tk)
}

// When a significant share of recent requests are retries, rejections say
// "overloaded; don't retry".
func TestRetryHistogramTurnsRejectionsIntoDontRetry(t *testing.T) {
	f := clock.NewFake(epoch)
	obs := &counter{}
	sig := &fixed{u: 2} // reject everything
	c := mustNew(t, admission.WithClock(f), admission.WithSignal(sig, admission.DefaultThresholds()), admission.WithObserver(obs))
	kind := func(attemptN int) outcome.Kind {
		var tk admission.Ticket
		oe, _ := outcome.As(c.Arrive(&tk, criticality.Critical, attemptN, time.Time{}, 0))
		return oe.Kind
	}
	for i := 0; i < 100; i++ {
		if k := kind(0); k != outcome.TaskOverloaded {
			t.Fatalf("first attempts only: %v", k)
		}
	}
	for i := 0; i < 5; i++ {
		kind(1)
	}
	// 5 retries in 105 requests: under 5%... the sixth tips it.
	kind(2)
	if k := kind(0); k != outcome.DontRetry {
		t.Fatalf("with 6 retries in 107 requests: %v, want don't retry", k)
	}
	if obs.dr == 0 {
		t.Fatal("observer not told")
	}
	// The histogram slides: ten seconds later the retries are forgotten.
	f.Advance(11 * time.Second)
	if k := kind(0); k != outcome.TaskOverloaded {
		t.Fatalf("after the window: %v", k)
	}
}

// sim runs a closed system on virtual time: arrivals at rate per second,
// each request's service time given by svc(executing) where executing is
// the number running when it starts, for d. It returns the controller's
// limit at the end and the mean latency of the last second.
func sim(t *testing.T, c *admission.Controller, f *clock.Fake, rate int, d time.Duration, svc func(executing int) time.Duration) (limit int64) {
	t.Helper()
	type running struct {
		tk  *admission.Ticket
		end time.Time
	}
	var runs []running
	var queue []*admission.Ticket
	step := time.Second / time.Duration(rate)
	end := f.Now().Add(d)
	for f.Now().Before(end) {
		now := f.Now()
		// complete what is due
		kept := runs[:0]
		for _, r := range runs {
			if !r.end.After(now) {
				c.Done(r.tk)
			} else {
				kept = append(kept, r)
			}
		}
		runs = kept
		// arrive
		tk := &admission.Ticket{}
		if err := c.Arrive(tk, criticality.Critical, 0, time.Time{}, 0); err == nil {
			queue = append(queue, tk)
		}
		// start what fits, in order, without blocking: the test stands in
		// for the waiting queue so that no goroutine is needed.
		for len(queue) > 0 && int64(len(runs)) < c.Stats().Limit {
			tk := queue[0]
			queue = queue[1:]
			if err := c.Start(context.Background(), tk); err != nil {
				t.Fatal(err)
			}
			runs = append(runs, running{tk, now.Add(svc(len(runs) + 1))})
		}
		if len(queue) > 0 {
			// The controller learns that requests waited through Start;
			// mimic one waiting Start per step by a short-lived waiter.
			markWaited(c)
		}
		for len(queue) > 64 {
			c.Done(queue[0])
			queue = queue[1:]
		}
		f.Advance(step)
	}
	for _, r := range runs {
		c.Done(r.tk)
	}
	for _, tk := range queue {
		c.Done(tk)
	}
	return c.Stats().Limit
}

// markWaited makes the controller see a request that had to wait: a Start
// that finds no free slot and gives up at once.
func markWaited(c *admission.Controller) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var tk admission.Ticket
	if c.Arrive(&tk, criticality.Critical, 0, time.Time{}, 0) == nil {
		if c.Start(ctx, &tk) == nil {
			// a slot was free after all
		}
		c.Done(&tk)
	}
}

// The limit is found, not configured: CPU-bound requests (each running
// request slows the others down) settle at a few slots; requests that wait
// on something else (service time independent of concurrency) get many.
func TestLimitAdaptsToTheWork(t *testing.T) {
	cpuBound := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	ioBound := func(int) time.Duration { return 20 * time.Millisecond }
	// The pending cap is not under test here: the simulation's own queue
	// stands in for the controller's waiting queue.
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 2, 1000), admission.WithTargetDelay(time.Hour))
	l := sim(t, c, f, 5000, 20*time.Second, cpuBound)
	t.Logf("CPU-bound limit %d", l)
	if l < 1 || l > 4 {
		t.Errorf("CPU-bound: limit %d, want 1-4", l)
	}
	f2 := clock.NewFake(epoch)
	c2 := mustNew(t, admission.WithClock(f2), admission.WithLimits(1, 2, 1000), admission.WithTargetDelay(time.Hour))
	l = sim(t, c2, f2, 5000, 20*time.Second, ioBound)
	t.Logf("I/O-bound limit %d", l)
	if l < 90 {
		t.Errorf("I/O-bound at 5000/s x 20 ms (100 in flight needed): limit %d", l)
	}
}

// runQueue is one CPU's run queue on virtual time, as the tests drive a
// Controller: arrivals admitted join it in order, and next starts the
// oldest, like Go's run queue of admitted requests' goroutines.
type runQueue struct {
	c         *admission.Controller
	queue     []*admission.Ticket
	arrivedAt map[*admission.Ticket]time.Time
}

func newRunQueue(c *admission.Controller) *runQueue {
	return &runQueue{c: c, arrivedAt: map[*admission.Ticket]time.Time{}}
}

// arrive offers a CRITICAL request at now.
func (q *runQueue) arrive(now time.Time) {
	tk := &admission.Ticket{}
	if q.c.Arrive(tk, criticality.Critical, 0, time.Time{}, 0) == nil {
		q.queue = append(q.queue, tk)
		q.arrivedAt[tk] = now
	}
}

// next starts the oldest request at now and returns it with its wait
// before start; nil when none waits.
func (q *runQueue) next(t *testing.T, now time.Time) (*admission.Ticket, time.Duration) {
	if len(q.queue) == 0 {
		return nil, 0
	}
	tk := q.queue[0]
	q.queue = q.queue[1:]
	if err := q.c.Start(context.Background(), tk); err != nil {
		t.Fatal(err)
	}
	w := now.Sub(q.arrivedAt[tk])
	delete(q.arrivedAt, tk)
	return tk, w
}

// On one CPU whose handlers never yield, admitted requests wait as runnable
// goroutines before their handler starts: the queue no interceptor sees.
// The pending cap finds the size at which that wait meets the target, for
// any handler cost: about target/cost requests (CRITICAL traffic here, whose
// headroom doubles the cap).
func TestPendingCapBoundsTheInvisibleQueue(t *testing.T) {
	for _, cost := range []time.Duration{200 * time.Microsecond, time.Millisecond, 5 * time.Millisecond} {
		f := clock.NewFake(epoch)
		c := mustNew(t, admission.WithClock(f))
		q := newRunQueue(c)
		var running *admission.Ticket
		var busyUntil time.Time
		step := cost / 10 // 10x the capacity
		var served, waited int
		var waitSum time.Duration
		end := f.Now().Add(30 * time.Second)
		for f.Now().Before(end) {
			now := f.Now()
			if running != nil && !now.Before(busyUntil) {
				c.Done(running)
				running = nil
				served++
			}
			q.arrive(now)
			if running == nil {
				var w time.Duration
				if running, w = q.next(t, now); running != nil {
					if now.After(end.Add(-10 * time.Second)) {
						waitSum += w
						waited++
					}
					busyUntil = now.Add(cost)
				}
			}
			f.Advance(step)
		}
		mean := waitSum / time.Duration(waited)
		st := c.Stats()
		t.Logf("cost %v: pending cap %.2f, mean wait before start %v over the last 10 s, served %.2f of capacity", cost, st.PendingCap, mean, float64(served)*float64(cost)/float64(30*time.Second))
		if mean > 2*admission.DefaultTargetDelay || mean < admission.DefaultTargetDelay/5 {
			t.Errorf("cost %v: mean wait before start %v, target %v", cost, mean, admission.DefaultTargetDelay)
		}
		if float64(served)*float64(cost)/float64(30*time.Second) < 0.95 {
			t.Errorf("cost %v: the CPU idled: served %d", cost, served)
		}
	}
}

func TestNewErrors(t *testing.T) {
	bad := admission.DefaultThresholds()
	bad.End[criticality.Critical] = bad.Start[criticality.Critical]
	for _, opts := range [][]admission.Option{
		{admission.WithInterval(time.Microsecond)}, {admission.WithTolerance(1)},
		{admission.WithLimits(0, 1, 1)}, {admission.WithLimits(2, 1, 3)}, {admission.WithLimits(1, 1, 1<<21)},
		{admission.WithMaxWait(0)}, {admission.WithMaxWaitServiceTimes(-1)}, {admission.WithQueueFactor(-1)},
		{admission.WithMaxStalled(-1)}, {admission.WithMaxStalled(1<<20 + 1)},
		{admission.WithSignal(nil, admission.DefaultThresholds())}, {admission.WithSignal(&fixed{}, bad)},
		{admission.WithRetryAfter(0, time.Second)}, {admission.WithRetryAfter(2*time.Second, time.Second)},
		{admission.WithRetryAfter(time.Second, 48*time.Hour)}, {admission.WithRetryAfter(time.Nanosecond, time.Hour)},
	} {
		if _, err := admission.New(opts...); !errors.Is(err, admission.ErrConfig) {
			t.Errorf("New: err = %v", err)
		}
	}
}

// A request admitted at arrival whose handler never runs (its stream was
// reset first) and that never calls Done stops counting after at most four
// seconds: the pending count returns to what the live requests hold, and
// the task admits again. Requests that do start and finish leave nothing.
func TestNeverStartedRequestsStopCounting(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f))
	live := make([]admission.Ticket, 3)
	for i := range live {
		if err := c.Arrive(&live[i], criticality.CriticalPlus, 0, time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
		if err := c.Start(context.Background(), &live[i]); err != nil {
			t.Fatal(err)
		}
	}
	var lost []admission.Ticket
	for {
		var tk admission.Ticket
		if c.Arrive(&tk, criticality.Sheddable, 0, time.Time{}, 0) != nil {
			break
		}
		lost = append(lost, tk) // never started, never done
		if len(lost) > 1000 {
			t.Fatal("the pending cap never filled")
		}
	}
	if got := c.Stats().Pending; got != int64(len(lost)+len(live)) {
		t.Fatalf("pending %d, want %d", got, len(lost)+len(live))
	}
	f.Advance(4 * time.Second)
	if got := c.Stats().Pending; got != int64(len(live)) {
		t.Fatalf("after 4 s: pending %d, want the %d live requests", got, len(live))
	}
	var tk admission.Ticket
	if err := c.Arrive(&tk, criticality.Sheddable, 0, time.Time{}, 0); err != nil {
		t.Fatalf("after the lost requests expired: %v", err)
	}
	c.Done(&tk)
	for i := range live {
		c.Done(&live[i])
	}
	// A lost request that shows up late is not counted twice.
	c.Start(context.Background(), &lost[0])
	c.Done(&lost[0])
	if s := c.Stats(); s.Pending != 0 || s.Executing != 0 {
		t.Fatalf("all done: pending %d, executing %d", s.Pending, s.Executing)
	}
}

// The baseline probe holds the limit at its minimum for one interval: it
// delays the requests that queue meanwhile, as BBR's ProbeRTT does, and
// sheds none of them at the usual maximum wait.
func TestProbeDelaysAndDoesNotShed(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 4, 4), admission.WithInterval(100*time.Millisecond),
		admission.WithMaxWait(50*time.Millisecond))
	var a admission.Ticket
	c.Arrive(&a, criticality.Critical, 0, time.Time{}, 0)
	c.Start(context.Background(), &a)
	f.Advance(10 * time.Millisecond)
	c.Done(&a)
	f.Advance(100 * time.Millisecond)
	var b, d admission.Ticket
	c.Arrive(&b, criticality.Critical, 0, time.Time{}, 0) // the first adjustment probes
	if got := c.Stats().Limit; got != 1 {
		t.Fatalf("limit %d during the probe, want the minimum, 1", got)
	}
	if err := c.Start(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	c.Arrive(&d, criticality.Critical, 0, time.Time{}, 0)
	done := start(c, context.Background(), &d)
	waitQueued(t, c, 1, f)
	f.Advance(60 * time.Millisecond) // past the 50 ms maximum wait
	select {
	case err := <-done:
		t.Fatalf("a request queued behind the probe ended after 60 ms: %v", err)
	default:
	}
	c.Done(&b)
	if err := <-done; err != nil {
		t.Fatalf("the freed slot: %v", err)
	}
	c.Done(&d)
}

// The baseline probe measures the requests it starts, not the ones that
// finish during it: in front of a service in another process whose
// latency grows with the requests in it (one CPU shared by its threads),
// the requests admitted before the probe finish in it with the old
// limit's latency, and a baseline taken from them let the limit ratchet
// up (Python's threaded server behind the sidecar: limit 7-9, 74 ms of
// service for 10 ms of work). Here eight requests started at the limit
// of 8 finish in the probe after 150 ms; the two the probe starts take
// 20 ms. After it, a service time of 50 ms is 2.5 times the baseline,
// and the limit shrinks although requests waited.
func TestProbeBaselineIsItsOwnRequests(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(2, 8, 100), admission.WithTolerance(1.2),
		admission.WithInterval(100*time.Millisecond), admission.WithRandom(func() float64 { return 0 }))
	var tk admission.Ticket
	c.Arrive(&tk, criticality.Critical, 0, time.Time{}, 0) // the first interval's measurement
	c.Start(context.Background(), &tk)
	f.Advance(10 * time.Millisecond)
	c.Done(&tk)
	var old [8]admission.Ticket
	startAll(t, c, old[:])
	f.Advance(90 * time.Millisecond)
	c.Arrive(&tk, criticality.Critical, 0, time.Time{}, 0) // the first interval ends: the probe begins
	c.Done(&tk)
	if s := c.Stats(); !s.Probing || s.Limit != 2 {
		t.Fatalf("after the first interval: %+v, want a probe at the limit of 2", s)
	}
	f.Advance(60 * time.Millisecond)
	doneAll(c, old[:]) // 150 ms each
	var probe [2]admission.Ticket
	startAll(t, c, probe[:])
	f.Advance(20 * time.Millisecond)
	doneAll(c, probe[:])
	f.Advance(20 * time.Millisecond)
	c.Arrive(&tk, criticality.Critical, 0, time.Time{}, 0) // the probe ends
	c.Done(&tk)
	s := c.Stats()
	if s.Probing || s.Limit != 8 {
		t.Fatalf("after the probe: %+v, want the limit of 8 back", s)
	}
	// An interval of 50 ms requests, the limit full and one more waiting.
	var next [9]admission.Ticket
	startAll(t, c, next[:8])
	c.Arrive(&next[8], criticality.Critical, 0, time.Time{}, admission.Shadow)
	if err := c.Start(context.Background(), &next[8]); !errors.Is(err, admission.ErrWouldWait) {
		t.Fatalf("the ninth request: %v, want ErrWouldWait", err)
	}
	c.Done(&next[8])
	f.Advance(50 * time.Millisecond)
	doneAll(c, next[:8])
	f.Advance(50 * time.Millisecond)
	c.Arrive(&tk, criticality.Critical, 0, time.Time{}, 0)
	c.Done(&tk)
	if got := c.Stats().Limit; got >= 8 {
		t.Fatalf("after an interval at 2.5 times the probe's own requests' service time, the limit is %d, want below 8", got)
	}
}

// startAll admits and starts CRITICAL requests into tks, each at once.
func startAll(t *testing.T, c *admission.Controller, tks []admission.Ticket) {
	t.Helper()
	for i := range tks {
		c.Arrive(&tks[i], criticality.Critical, 0, time.Time{}, 0)
		if err := c.Start(context.Background(), &tks[i]); err != nil {
			t.Fatal(err)
		}
	}
}

// doneAll ends the requests of tks.
func doneAll(c *admission.Controller, tks []admission.Ticket) {
	for i := range tks {
		c.Done(&tks[i])
	}
}
