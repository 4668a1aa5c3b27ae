package admission

import (
	"fmt"
	"math"

	"github.com/triagehq/triage/criticality"
)

// Thresholds say, per criticality, where shedding by a signal starts and
// where it is complete: a request of level l is rejected with probability
// rising linearly from 0 at Start[l] to 1 at End[l] (utilization as a
// fraction of the target). Higher criticalities have higher thresholds, so
// as utilization rises SHEDDABLE is shed first, CRITICAL_PLUS last, and no
// class flips on and off.
type Thresholds struct {
	Start, End [criticality.NumLevels]float64
}

// DefaultThresholds shed SHEDDABLE from 80% to 90% of a signal's target,
// SHEDDABLE_PLUS from 85% to 95%, CRITICAL from 90% to 100% and
// CRITICAL_PLUS from 95% to 105%: the book's "higher thresholds for higher
// criticalities", with each class's ramp overlapping the next so that the
// task sheds progressively while the classes above still run.
func DefaultThresholds() Thresholds {
	var t Thresholds
	for l, s := range [criticality.NumLevels]float64{0.80, 0.85, 0.90, 0.95} {
		t.Start[l], t.End[l] = s, s+0.10
	}
	return t
}

func (t Thresholds) validate() error {
	for l := range t.Start {
		if !(t.Start[l] >= 0 && t.End[l] > t.Start[l] && !math.IsInf(t.End[l], 0)) {
			return fmt.Errorf("%w: thresholds for %v: need 0 <= start < end, got %v and %v",
				ErrConfig, criticality.Level(l), t.Start[l], t.End[l])
		}
		if l > 0 && (t.Start[l] < t.Start[l-1] || t.End[l] < t.End[l-1]) {
			return fmt.Errorf("%w: thresholds must not decrease with criticality (%v)", ErrConfig, criticality.Level(l))
		}
	}
	return nil
}

// rejectP returns the probability of rejecting level l at utilization u.
func (t *Thresholds) rejectP(l criticality.Level, u float64) float64 {
	s, e := t.Start[l], t.End[l]
	switch {
	case u <= s:
		return 0
	case u >= e:
		return 1
	}
	return (u - s) / (e - s)
}
