package retry_test

import (
	"context"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/shadow"
)

// refusals counts what an enforcing Policy refuses.
type refusals struct {
	retry.Nop
	throttled, budget int64
}

func (r *refusals) Throttled(criticality.Level)     { r.throttled++ }
func (r *refusals) BudgetRefused(criticality.Level) { r.budget++ }

// A client whose backend refuses everything: enforcing, its throttle
// soon rejects most requests locally and its budget refuses retries; in
// shadow, every request and retry is sent, each request's first would-be
// refusal is counted (as many as enforcement makes), and the throttle
// decides as the enforcing one does: it records a would-be rejection as
// a rejection whatever the answer, and does not see the attempts
// enforcement would not have made.
func TestShadowClientSendsEverything(t *testing.T) {
	run := func(s shadow.Set) (sent int, failed int, counts map[shadow.Key]int64, refused *refusals, p *retry.Policy) {
		clk := clock.NewFake(time.Unix(0, 0))
		var c shadow.Counts
		refused = &refusals{}
		draws := 0
		p, err := retry.New(retry.WithClock(clk), retry.WithBackoff(0, 0), retry.WithShadow(s, &c), retry.WithObserver(refused),
			retry.WithRandom(func() float64 { draws++; return float64(draws%97) / 97 }))
		if err != nil {
			t.Fatal(err)
		}
		ctx := criticality.NewContext(context.Background(), criticality.Sheddable)
		for range 2000 {
			if err := p.Do(ctx, func(context.Context) error {
				sent++
				return outcome.New(outcome.TaskOverloaded, "busy")
			}); err != nil {
				failed++
			}
			clk.Advance(50 * time.Millisecond)
		}
		return sent, failed, c.Snapshot(), refused, p
	}
	sent, failed, _, refused, enforcing := run(0)
	if sent >= 2000 || failed != 2000 {
		t.Fatalf("enforcing: %d attempts sent for 2000 requests, %d failed; want fewer attempts than requests", sent, failed)
	}
	sentShadow, _, counts, _, shadowing := run(shadow.All())
	if sentShadow < 3*2000 {
		t.Errorf("shadow: %d attempts for 2000 requests, want every request's 3 attempts", sentShadow)
	}
	throttled := counts[shadow.Key{Mechanism: shadow.Throttle, Reason: "throttled", Level: criticality.Sheddable}]
	budget := counts[shadow.Key{Mechanism: shadow.RetryBudget, Reason: "retry-budget", Level: criticality.Sheddable}]
	if throttled != refused.throttled || budget != refused.budget {
		t.Errorf("shadow would have refused %d requests in the throttle and %d retries in the budget; enforcement refused %d and %d",
			throttled, budget, refused.throttled, refused.budget)
	}
	es, ss := enforcing.Throttle().Stats(criticality.Sheddable), shadowing.Throttle().Stats(criticality.Sheddable)
	t.Logf("enforcing: %d attempts sent, %d throttled, %d budget refusals, reject probability %.3f; shadow: %d sent, %d and %d would have been, reject probability %.3f",
		sent, refused.throttled, refused.budget, es.RejectProbability, sentShadow, throttled, budget, ss.RejectProbability)
	if d := es.RejectProbability - ss.RejectProbability; d > 0.02 || d < -0.02 {
		t.Errorf("the throttle's rejection probability: enforcing %.3f, in shadow %.3f", es.RejectProbability, ss.RejectProbability)
	}
}
