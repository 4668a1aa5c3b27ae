package admission_test

import (
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/admission/limit"
	"github.com/triagehq/triage/clock"
)

// fixedRule is a limit.Rule that asks for one limit whatever it measures,
// and counts its steps.
type fixedRule struct {
	want  int64
	steps *int
}

func (r fixedRule) Step(s limit.State, _ limit.Sample) limit.State {
	*r.steps++
	s.Limit = r.want
	return s
}

// The Controller runs the rule WithLimitRule gives it each interval, and
// keeps what it asks for within WithLimits' bounds.
func TestLimitRuleIsPluggedAndBounded(t *testing.T) {
	ioBound := func(int) time.Duration { return 20 * time.Millisecond }
	for _, tc := range []struct{ want, got int64 }{{7, 7}, {1 << 40, 300}, {-5, 3}} {
		steps := 0
		f := clock.NewFake(epoch)
		c := mustNew(t, admission.WithClock(f), admission.WithLimits(3, 4, 300), admission.WithTargetDelay(time.Hour),
			admission.WithLimitRule(fixedRule{tc.want, &steps}))
		if l := sim(t, c, f, 2000, 5*time.Second, ioBound); int64(l) != tc.got || steps == 0 {
			t.Errorf("a rule asking for %d: limit %d after %d steps, want %d", tc.want, l, steps, tc.got)
		}
	}
}

// The Gradient rule, plugged in, finds the limit I/O-bound requests need.
// (On CPU-bound requests it lets the limit creep, as its long-term mean
// trails the service time it inflates: docs/admission.md, "Two limit
// rules"; Latency's probe is what prevents that, TestLimitAdaptsToTheWork.)
func TestGradientRuleFindsAnIOBoundLimit(t *testing.T) {
	ioBound := func(int) time.Duration { return 20 * time.Millisecond }
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 2, 1000), admission.WithTargetDelay(time.Hour),
		admission.WithLimitRule(limit.NewGradient(1, 1000, 1.5)))
	if l := sim(t, c, f, 5000, 20*time.Second, ioBound); l < 90 {
		t.Errorf("I/O-bound at 5000/s x 20 ms (100 in flight needed): limit %d", l)
	}
}
