package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
)

// A request is refused for its deadline at arrival when the requests it
// would wait behind, and its own service, would take longer: those of
// its level and above, not the less critical ones it goes ahead of (the
// sidecar at 10x refused CRITICAL_PLUS requests with a second to spare
// for the SHEDDABLE queue behind them).
func TestDeadlineCountsOnlyTheRequestsAhead(t *testing.T) {
	const svc = 20 * time.Millisecond
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithLimits(1, 1, 1), admission.WithInterval(100*time.Millisecond),
		admission.WithMaxWait(2*time.Second), admission.WithQueueFactor(64))
	for range 20 {
		tk := occupy(t, c)
		f.Advance(svc)
		c.Done(tk)
	}
	tick(c) // measures the 20 ms service time
	running := occupy(t, c)
	var waiting []*admission.Ticket
	var gaveUp []<-chan error
	for i := range 60 { // 1.2 s of SHEDDABLE work queued
		tk, errc := queue(t, c, f, criticality.Sheddable, int64(i+1))
		waiting, gaveUp = append(waiting, tk), append(gaveUp, errc)
	}
	deadline := f.Now().Add(time.Second)

	var shed admission.Ticket
	if err := c.Arrive(&shed, criticality.Sheddable, 0, deadline, 0); reason(t, err) != admission.Deadline {
		t.Fatalf("a SHEDDABLE request with 1 s behind 1.2 s of its level: %v, want refused for its deadline", err)
	}
	c.Done(&shed)
	for _, l := range []criticality.Level{criticality.CriticalPlus, criticality.Critical, criticality.SheddablePlus} {
		var tk admission.Ticket
		if err := c.Arrive(&tk, l, 0, deadline, 0); err != nil {
			t.Fatalf("a %v request with 1 s ahead of 1.2 s of SHEDDABLE work: %v, want admitted", l, err)
		}
		c.Done(&tk)
	}

	var first admission.Ticket
	if err := c.Arrive(&first, criticality.CriticalPlus, 0, deadline, 0); err != nil {
		t.Fatal(err)
	}
	firstErr := start(c, context.Background(), &first)
	waitQueued(t, c, 61, f)
	c.Done(running)
	if err := <-firstErr; err != nil {
		t.Fatalf("the CRITICAL_PLUS request: %v, want the next slot", err)
	}
	c.Done(&first)
	f.Advance(3 * time.Second) // the SHEDDABLE ones give up, but the one the slot went to
	for i, tk := range waiting {
		<-gaveUp[i]
		c.Done(tk)
	}
}
