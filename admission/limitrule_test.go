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
