package limit

import (
	"math"
	"time"
)

// Gradient finds the limit from the ratio of a long-term mean service
// time to the interval's, the rule of Netflix's Gradient2 limit: each
// interval the limit is multiplied by the gradient, Tolerance times the
// long-term mean over the interval's mean, clamped to [0.5, 1], plus
// QueueSize, and moved a Smoothing share of the way there. A service time
// within Tolerance of the long-term one leaves the gradient at 1, so the
// limit grows by QueueSize x Smoothing an interval, and only while
// requests waited for a slot (a limit nobody fills is not evidence);
// a service time that inflates shrinks it at once. The long-term mean
// follows the interval's means over about LongIntervals intervals, and
// decays faster while it stands at more than twice the interval's mean,
// so that a recovered service is believed soon. Unlike Latency it never
// probes at a low limit.
//
// The zero value is not useful: set every field, or start from
// NewGradient.
type Gradient struct {
	Min, Max      int64   // the limit's bounds, Min >= 1
	Tolerance     float64 // >= 1; Gradient2's default is 1.5
	Smoothing     float64 // in (0, 1]; 0.2
	QueueSize     int64   // the headroom added each interval; 4
	LongIntervals int64   // the long-term mean's window, in intervals; >= 1
}

// Step implements Rule.
func (r Gradient) Step(s State, m Sample) State {
	s.Intervals++
	short := float64(m.Mean)
	if short <= 0 {
		return s
	}
	long := float64(s.Baseline)
	switch {
	case long == 0:
		long = short
	case long > 2*short:
		long *= 0.95
	}
	long += (short - long) / float64(r.LongIntervals)
	s.Baseline = time.Duration(long)
	g := max(0.5, min(1, r.Tolerance*long/short))
	if g >= 1 && !m.Waited {
		return s
	}
	next := float64(s.Limit)*g + float64(r.QueueSize)
	next = float64(s.Limit)*(1-r.Smoothing) + next*r.Smoothing
	s.Limit = min(r.Max, max(r.Min, int64(math.Round(next))))
	return s
}

// NewGradient returns a Gradient with Gradient2's defaults for the rest:
// Smoothing 0.2, QueueSize 4, and a long-term mean over 60 intervals (6 s
// at admission's default interval, where Gradient2 averages 600 samples).
func NewGradient(min, max int64, tolerance float64) Gradient {
	return Gradient{Min: min, Max: max, Tolerance: tolerance, Smoothing: 0.2, QueueSize: 4, LongIntervals: 60}
}
