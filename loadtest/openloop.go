package loadtest

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/triagehq/triage/clock"
)

// OpenLoop paces an open-loop load: send i leaves at its time in the
// schedule whatever happened to the sends before it, so that a slow
// server meets more load, not less (a closed loop would wait for it).
// It is the one schedule of triage's load test, drill and benchmarks.
//
// The zero value paces on the real clock, waits out every send's time
// and bounds nothing but the schedule. An OpenLoop is a value: Run may be
// called from many goroutines at once.
type OpenLoop struct {
	// Clock paces the sends; nil is the real clock.
	Clock clock.Clock
	// Early is how far ahead of its time a send may leave rather than
	// wait: a wait shorter than a real timer's granularity (about 200 µs
	// here) would make every later send late. Zero waits for every time.
	Early time.Duration
	// MaxInFlight bounds the calls running at once: a send past it is not
	// made but counted in Paced.Skipped, with Skip called if set. Zero is
	// no bound but the schedule's length.
	MaxInFlight int
	// Skip, if set, is called on the pacing goroutine for each send that
	// MaxInFlight refused, with its lag.
	Skip func(i int, lag time.Duration)
	// Late is the lag past which a send counts in Paced.Late; zero is 10 ms.
	Late time.Duration
}

// Paced is what Run did.
type Paced struct {
	Start   time.Time     // the schedule's time zero
	Sent    int           // sends fire was called for
	Skipped int           // sends MaxInFlight refused
	Late    int           // sends more than OpenLoop.Late behind their time
	MaxLag  time.Duration // the latest send's lag
	Stopped bool          // ctx ended before the schedule did
}

// Every returns the schedule of rate sends per second for d: send i at
// i/rate, rounded to the nanosecond, for i below rate times d; its end is
// d.
func Every(rate float64, d time.Duration) func(i int) (time.Duration, bool) {
	n := int(rate * d.Seconds())
	return func(i int) (time.Duration, bool) {
		if i >= n {
			return d, false
		}
		return time.Duration(math.Round(float64(i) / rate * float64(time.Second))), true
	}
}

// Run paces the schedule at: for i = 0, 1, ... until at(i) says there is
// no send i (or ctx ends), it waits until at(i) after the start and calls
// fire(i, lag) on the pacing goroutine, lag being how late it is. fire
// returns the call to make, which runs in a goroutine of its own, or nil
// when it made the send itself. The time at returns with false is the
// schedule's end: Run waits until then, and until every call has
// returned. at is called once per i, in order.
func (o OpenLoop) Run(ctx context.Context, at func(i int) (time.Duration, bool), fire func(i int, lag time.Duration) func()) Paced {
	clk := clock.OrReal(o.Clock)
	late := o.Late
	if late <= 0 {
		late = 10 * time.Millisecond
	}
	var timer clock.Timer // made at the first wait: no timer pends but the schedule's
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	wait := func(d time.Duration) {
		if timer == nil {
			timer = clk.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-timer.C():
		case <-ctx.Done():
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	var slots chan struct{}
	if o.MaxInFlight > 0 {
		slots = make(chan struct{}, o.MaxInFlight)
	}
	p := Paced{Start: clk.Now()}
	for i := 0; ; i++ {
		t, ok := at(i)
		if d := t - clk.Now().Sub(p.Start); d > o.Early || (!ok && d > 0) {
			wait(d)
		}
		if !ok {
			p.Stopped = ctx.Err() != nil
			return p
		}
		if ctx.Err() != nil {
			p.Stopped = true
			return p
		}
		lag := max(clk.Now().Sub(p.Start)-t, 0)
		p.MaxLag = max(p.MaxLag, lag)
		if lag > late {
			p.Late++
		}
		if slots != nil {
			select {
			case slots <- struct{}{}:
			default:
				p.Skipped++
				if o.Skip != nil {
					o.Skip(i, lag)
				}
				continue
			}
		}
		p.Sent++
		call := fire(i, lag)
		if call == nil {
			if slots != nil {
				<-slots
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if slots != nil {
				defer func() { <-slots }()
			}
			call()
		}()
	}
}
