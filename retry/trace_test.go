package retry_test

import (
	"context"
	"testing"
	"time"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/retry"
)

type tracer struct {
	events []retry.Event
	tags   []string
}

type tagKey struct{}

func (r *tracer) Trace(ctx context.Context, e *retry.Event) {
	r.events = append(r.events, *e)
	tag, _ := ctx.Value(tagKey{}).(string)
	r.tags = append(r.tags, tag)
}

// The Tracer is told, in the request's context, each retry (its attempt,
// its backoff, the answer it retries) and the giving up; or the budget's
// refusal of a retry.
func TestTracerIsToldRetriesAndGivingUp(t *testing.T) {
	overloaded := func(context.Context) error { return outcome.New(outcome.TaskOverloaded, "cpu") }
	ctx := context.WithValue(criticality.NewContext(context.Background(), criticality.Critical), tagKey{}, "request")

	rec := &tracer{}
	p, err := retry.New(retry.WithTracer(rec), retry.WithoutThrottle(), retry.WithoutBudget(), retry.WithBackoff(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Do(ctx, overloaded); err == nil {
		t.Fatal("overloaded three times, and no error")
	}
	kinds := []retry.EventKind{retry.Retried, retry.Retried, retry.Exhausted}
	if len(rec.events) != len(kinds) {
		t.Fatalf("%d events, want %d: %+v", len(rec.events), len(kinds), rec.events)
	}
	for i, e := range rec.events {
		if e.Kind != kinds[i] || e.Level != criticality.Critical || rec.tags[i] != "request" || outcome.Classify(e.Err) != outcome.TaskOverloaded {
			t.Errorf("event %d: %+v in %q", i, e, rec.tags[i])
		}
	}
	if rec.events[0].Attempt != 1 || rec.events[1].Attempt != 2 {
		t.Errorf("retries of attempts %d and %d, want 1 and 2", rec.events[0].Attempt, rec.events[1].Attempt)
	}

	rec = &tracer{}
	p, err = retry.New(retry.WithTracer(rec), retry.WithoutThrottle(), retry.WithBudget(0.01, time.Second), retry.WithBackoff(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 { // the budget's one spare retry goes, then retries are refused
		_ = p.Do(ctx, overloaded)
	}
	last := rec.events[len(rec.events)-1]
	if last.Kind != retry.BudgetRefused || last.Attempt != 1 || outcome.Classify(last.Err) != outcome.TaskOverloaded {
		t.Errorf("with a 1%% budget spent: %+v, want the first retry refused", rec.events)
	}
}
