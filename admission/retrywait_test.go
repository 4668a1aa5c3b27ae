package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
)

// The maximum wait lets a refused client retry elsewhere in time. When
// the task's refusals say "don't retry" (many recent requests are
// retries), a CRITICAL request waits for a slot until its deadline
// instead; a SHEDDABLE one is still refused after the maximum wait, and
// without many retries so is a CRITICAL one.
func TestCriticalWaitsWhenRefusalsSayDontRetry(t *testing.T) {
	for _, retries := range []bool{true, false} {
		f := clock.NewFake(time.Now()) // context deadlines are real time
		c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 1, 1), admission.WithMaxWait(50*time.Millisecond))
		if retries {
			for range 40 {
				var tk admission.Ticket
				if err := c.Arrive(&tk, criticality.Sheddable, 1, time.Time{}, 0); err != nil {
					t.Fatal(err)
				}
				c.Start(context.Background(), &tk)
				c.Done(&tk)
			}
		}
		var running, crit, shed admission.Ticket
		c.Arrive(&running, criticality.Critical, 0, time.Time{}, 0)
		if err := c.Start(context.Background(), &running); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithDeadline(context.Background(), f.Now().Add(time.Minute))
		defer cancel()
		dl, _ := ctx.Deadline()
		if err := c.Arrive(&crit, criticality.Critical, 0, dl, 0); err != nil {
			t.Fatal(err)
		}
		critDone := start(c, ctx, &crit)
		waitQueued(t, c, 1, f)
		if err := c.Arrive(&shed, criticality.Sheddable, 0, dl, 0); err != nil {
			t.Fatal(err)
		}
		shedDone := start(c, ctx, &shed)
		waitQueued(t, c, 2, f)
		f.Advance(100 * time.Millisecond)
		if err := <-shedDone; reason(t, err) != admission.Concurrency {
			t.Fatalf("retries %v: SHEDDABLE after the maximum wait: %v", retries, err)
		}
		if !retries {
			if err := <-critDone; reason(t, err) != admission.Concurrency {
				t.Fatalf("few retries: CRITICAL after the maximum wait: %v", err)
			}
			c.Done(&running)
			continue
		}
		c.Done(&running)
		if err := <-critDone; err != nil {
			t.Fatalf("CRITICAL refused after waiting 100 ms of a minute's deadline, although nobody would retry it: %v", err)
		}
		c.Done(&crit)
		c.Done(&shed)
		if s := c.Stats(); s.Executing != 0 || s.Queued != 0 || s.Pending != 0 {
			t.Fatalf("after Done: %+v", s)
		}
	}
}

// A CRITICAL request queued while few requests were retries has the
// maximum wait, so that its client can retry elsewhere. If retries become
// many while it waits, its refusal would now say "don't retry": nobody
// would try it again, so it waits on for a slot until its deadline, as if
// it had arrived then.
func TestCriticalWaitsOnWhenRetriesRiseDuringItsWait(t *testing.T) {
	f := clock.NewFake(time.Now()) // context deadlines are real time
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 1, 1), admission.WithMaxWait(50*time.Millisecond))
	var running, crit admission.Ticket
	c.Arrive(&running, criticality.Critical, 0, time.Time{}, 0)
	if err := c.Start(context.Background(), &running); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithDeadline(context.Background(), f.Now().Add(time.Minute))
	defer cancel()
	dl, _ := ctx.Deadline()
	if err := c.Arrive(&crit, criticality.Critical, 0, dl, 0); err != nil {
		t.Fatal(err)
	}
	critDone := start(c, ctx, &crit)
	waitQueued(t, c, 1, f)
	// Retries arrive (refused or not, each counts as an arrival).
	for range 40 {
		var tk admission.Ticket
		if c.Arrive(&tk, criticality.Sheddable, 1, time.Time{}, 0) == nil {
			c.Done(&tk)
		}
	}
	f.Advance(100 * time.Millisecond)
	select {
	case err := <-critDone:
		t.Fatalf("CRITICAL refused after its maximum wait, when its refusal says don't retry: %v", err)
	default:
	}
	c.Done(&running)
	if err := <-critDone; err != nil {
		t.Fatalf("CRITICAL not given the slot: %v", err)
	}
	c.Done(&crit)
	if s := c.Stats(); s.Executing != 0 || s.Queued != 0 || s.Pending != 0 {
		t.Fatalf("after Done: %+v", s)
	}
}
