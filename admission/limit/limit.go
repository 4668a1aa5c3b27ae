// Package limit holds the rules that find a task's execution limit, how
// many requests it runs at once, one interval at a time from what its
// limiter measured: the "limit" half of Netflix's concurrency-limits
// split, package admission being the limiter that enforces it.
//
// A Rule is a pure value: Step returns the next State from the last one
// and the interval's Sample and touches nothing, so that a rule is tested
// with step tables, run on virtual time, and swapped without changing the
// limiter (admission.WithLimitRule). Latency is the default.
//
// Rules are safe for concurrent use; the limiter calls Step from one
// goroutine at a time. A State is a few words; nothing grows.
package limit

import "time"

// Sample is what the limiter measured in one interval.
type Sample struct {
	// Mean is the mean service time of the interval's sampled requests.
	Mean time.Duration
	// Probe is the mean service time of the requests started while the
	// rule probed (State.Probing); zero when none was measured.
	Probe time.Duration
	// Waited says whether a request had to wait for an execution slot.
	Waited bool
}

// State is a rule's state between intervals. The limiter reads Limit,
// Probing and Resume; the other fields are the rule's memory.
type State struct {
	// Limit is the execution limit for the next interval.
	Limit int64
	// Probing says the rule runs this interval at a low limit to measure
	// an unloaded service time: the limiter measures the requests it
	// starts apart (Sample.Probe) and keeps the room of the queue the
	// probe delays, as for Resume.
	Probing bool
	// Resume is the limit the rule returns to after its probe.
	Resume int64
	// Baseline is the service time the rule compares against; zero
	// before its first measurement.
	Baseline time.Duration
	// Probed counts the intervals the current probe has lasted,
	// Intervals every interval stepped.
	Probed, Intervals int64
}

// A Rule finds the execution limit.
type Rule interface {
	// Step is one interval: the next state from s and what the interval
	// measured. The limiter keeps the result within its own bounds.
	Step(s State, m Sample) State
}

// stepDivisor is how far a limit moves in one interval: by a tenth of
// itself, and at least one unit.
const stepDivisor = 10

// Latency finds the limit from service time: the limit grows while the
// service time stays within Tolerance of its baseline and requests had to
// wait, shrinks when the service time inflates past it, and every
// ProbeEvery intervals the rule measures the baseline at Min (as BBR's
// ProbeRTT does, since a baseline taken at the current limit would let the
// limit ratchet up). The baseline is the service time of the requests the
// probe started: those admitted before it finish in it with the old
// limit's latency. A probe lasts until one of its own requests is
// measured, at most MaxProbe intervals.
//
// The zero value is not useful: set every field (package admission builds
// it from its options).
type Latency struct {
	Min, Max   int64   // the limit's bounds, Min >= 1
	Tolerance  float64 // > 1
	ProbeEvery int64   // intervals between probes, >= 1
}

// MaxProbe bounds the intervals a probe lasts waiting for a measurement
// of a request it started; then the probe interval's mean serves.
const MaxProbe = 5

// Step implements Rule.
func (r Latency) Step(s State, m Sample) State {
	s.Intervals++
	switch {
	case s.Probing && m.Probe == 0 && s.Probed+1 < MaxProbe:
		// Only requests admitted before the probe finished in it.
		s.Probed++
	case s.Probing:
		// The probe's own requests' service time is the baseline until
		// the next probe.
		own := m.Probe
		if own == 0 {
			own = m.Mean
		}
		s.Baseline, s.Probing, s.Probed, s.Limit = own, false, 0, s.Resume
	case s.Baseline == 0 || s.Intervals%r.ProbeEvery == 0:
		if s.Limit > r.Min {
			s.Probing, s.Resume, s.Limit = true, s.Limit, r.Min
		} else {
			s.Baseline = m.Mean
		}
	case float64(m.Mean) > r.Tolerance*float64(s.Baseline):
		s.Limit = max(r.Min, min(s.Limit-1, s.Limit*(stepDivisor-1)/stepDivisor))
	case m.Waited:
		s.Limit = min(r.Max, s.Limit+max(1, s.Limit/stepDivisor))
	}
	return s
}
