package drill

import (
	"fmt"
	"strings"
	"testing"
)

// The shadow comparison sums the run with triage's refusals and the run
// in shadow's would-be refusals by mechanism, reason and criticality,
// across tiers and seconds; the other runs and the refusals that are no
// mechanism's are left out; the medians leave the run in shadow out.
func TestCompareShadow(t *testing.T) {
	with := &RunResult{Name: "with triage", Protection: true, Seconds: []Second{
		{Refused: map[string]int{"db admission concurrency SHEDDABLE": 5, "a throttled SHEDDABLE": 2, "db out-of-quota SHEDDABLE abuser on db-0": 3}},
		{Refused: map[string]int{"b admission concurrency SHEDDABLE": 1, "a retry budget CRITICAL": 1, "db deadline": 7, "frontend HTTP 503": 4}},
	}}
	inShadow := &RunResult{Name: "triage in shadow", Protection: true, Shadow: true, Seconds: []Second{
		{Refused: map[string]int{"db would admission concurrency SHEDDABLE": 9, "db would quota out-of-quota SHEDDABLE": 3, "a would throttle throttled CRITICAL": 1}},
	}}
	without := &RunResult{Name: "without triage", Seconds: []Second{{Refused: map[string]int{"db admission concurrency SHEDDABLE": 100}}}}
	rows := compareShadow([]*RunResult{with, without, inShadow})
	var got []string
	for _, r := range rows {
		got = append(got, fmt.Sprintf("%s/%s/%s %d %d", r.Mechanism, r.Reason, r.Criticality, r.Refused, r.WouldRefuse))
	}
	want := []string{
		"admission/concurrency/SHEDDABLE 6 9",
		"quota/out-of-quota/SHEDDABLE 3 3",
		"retry-budget/retry-budget/CRITICAL 1 0",
		"throttle/throttled/CRITICAL 0 1",
		"throttle/throttled/SHEDDABLE 2 0",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if compareShadow([]*RunResult{with, without}) != nil {
		t.Error("a comparison without a run in shadow")
	}
	if m := medians([]*RunResult{with, inShadow}); len(m) != 1 || m[0].Rounds != 1 {
		t.Errorf("the medians count the run in shadow: %+v", m)
	}
	res := &Result{Runs: []*RunResult{with, inShadow}, ShadowRows: rows}
	if s := res.Summary(); !strings.Contains(s, "would refuse, in shadow") {
		t.Errorf("the summary has no shadow table:\n%s", s)
	}
}
