// Package clock is the time source every time-dependent mechanism in triage
// takes, so that tests and the simulator run the same code on virtual time.
//
// The book's mechanisms are all defined over time: adaptive throttling counts
// requests over "the last two minutes" (SRE book ch. 21, "Client-Side
// Throttling"), retry budgets keep a ratio over a window, lame duck drains for
// an interval (ch. 20). None of them calls time.Now directly; each takes a
// Clock option that defaults to Real.
package clock

import "time"

// Clock tells the time and makes timers. Implementations are safe for
// concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a timer that fires once, d after Now.
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer made by a Clock. It mirrors *time.Timer.
type Timer interface {
	// C returns the channel on which the fire time is delivered.
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it was pending.
	Stop() bool
	// Reset makes the timer fire d from now; it reports whether it was pending.
	Reset(d time.Duration) bool
}

// Real returns the wall clock. It is the default of every Clock option.
func Real() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Since reads only the monotonic clock, about half the cost of Now.
func (realClock) Since(t time.Time) time.Duration { return time.Since(t) }

func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return realTimer{time.AfterFunc(d, f)} }

// AfterFunc waits for d on c, then calls f. It returns a Timer whose Stop
// and Reset work as those of time.AfterFunc's timer (Stop does not wait
// for an f already started) and whose C is nil. On Real, f runs in its
// own goroutine; on a Fake, on the goroutine that moves the time past it.
// A Clock with no AfterFunc method of its own has no such timers:
// AfterFunc then returns one that never calls f.
func AfterFunc(c Clock, d time.Duration, f func()) Timer {
	if a, ok := c.(interface {
		AfterFunc(time.Duration, func()) Timer
	}); ok {
		return a.AfterFunc(d, f)
	}
	return idleTimer{}
}

type idleTimer struct{}

func (idleTimer) C() <-chan time.Time      { return nil }
func (idleTimer) Stop() bool               { return false }
func (idleTimer) Reset(time.Duration) bool { return false }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

// OrReal returns c, or Real when c is nil. Options use it to apply the default.
func OrReal(c Clock) Clock {
	if c == nil {
		return Real()
	}
	return c
}

// SinceFunc returns a function that measures the time elapsed on c since
// start. For Real it reads only the monotonic clock (time.Since), which on
// the hot paths of the mechanisms costs about half of Now; for any other
// clock it is c.Now().Sub(start). Mechanisms resolve it once, at
// construction.
func SinceFunc(c Clock, start time.Time) func() time.Duration {
	if s, ok := c.(interface{ Since(time.Time) time.Duration }); ok {
		return func() time.Duration { return s.Since(start) }
	}
	return func() time.Duration { return c.Now().Sub(start) }
}
