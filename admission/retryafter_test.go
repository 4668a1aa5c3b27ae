package admission_test

import (
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/outcome"
)

// retryAfter is the RetryAfter of the rejection of one request of level l
// (the signal rejects every level).
func retryAfter(t *testing.T, c *admission.Controller, l criticality.Level) time.Duration {
	t.Helper()
	var tk admission.Ticket
	err := c.Arrive(&tk, l, 0, time.Time{}, 0)
	if _, _, ok := admission.RejectionOf(err); !ok {
		t.Fatalf("%v: not a rejection: %v", l, err)
	}
	oe, _ := outcome.As(err)
	return oe.RetryAfter
}

// The rejections of a sheddable level carry a RetryAfter once the level
// has been shed for a second, growing with the spell (jittered down by at
// most 3/8) up to the maximum; critical levels never carry one; a spell
// ends after two seconds without a rejection of the level.
func TestSheddableRetryAfterGrowsWithTheSpell(t *testing.T) {
	f := clock.NewFake(epoch)
	sig := &fixed{u: 2} // past every threshold: everything is rejected
	c := mustNew(t, admission.WithClock(f), admission.WithSignal(sig, admission.DefaultThresholds()))
	within := func(l criticality.Level, want time.Duration) {
		t.Helper()
		for range 20 {
			got := retryAfter(t, c, l)
			if want == 0 && got != 0 || want > 0 && (got < want*5/8 || got > want) {
				t.Fatalf("%v after %v of shedding: RetryAfter %v, want %v (jittered down to 5/8)", l, f.Now().Sub(epoch), got, want)
			}
		}
	}
	for _, l := range []criticality.Level{criticality.Sheddable, criticality.SheddablePlus} {
		within(l, 0) // the spell starts
	}
	step := func(d time.Duration) {
		for end := f.Now().Add(d); f.Now().Before(end); {
			f.Advance(500 * time.Millisecond)
			retryAfter(t, c, criticality.Sheddable)
			retryAfter(t, c, criticality.SheddablePlus)
		}
	}
	step(time.Second)
	within(criticality.Sheddable, time.Second)
	within(criticality.SheddablePlus, time.Second)
	within(criticality.Critical, 0)
	within(criticality.CriticalPlus, 0)
	step(9 * time.Second) // shed for 10 s: 8 s
	within(criticality.Sheddable, 8*time.Second)
	step(10 * time.Minute)
	within(criticality.SheddablePlus, admission.DefaultRetryAfterMax)
	// SHEDDABLE not rejected for 2 s: its spell starts over; the other's
	// goes on.
	for range 5 {
		f.Advance(500 * time.Millisecond)
		retryAfter(t, c, criticality.SheddablePlus)
	}
	within(criticality.Sheddable, 0)
	within(criticality.SheddablePlus, admission.DefaultRetryAfterMax)
	// The jitter spreads the answers.
	seen := map[time.Duration]bool{}
	for range 64 {
		seen[retryAfter(t, c, criticality.SheddablePlus)] = true
	}
	if len(seen) < 3 {
		t.Fatalf("RetryAfter not jittered: %v", seen)
	}
}

func TestRetryAfterOff(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithSignal(&fixed{u: 2}, admission.DefaultThresholds()), admission.WithRetryAfter(0, 0))
	for range 100 {
		f.Advance(100 * time.Millisecond)
		if d := retryAfter(t, c, criticality.Sheddable); d != 0 {
			t.Fatalf("RetryAfter %v with WithRetryAfter(0, 0)", d)
		}
	}
}

// The rejection path with a RetryAfter allocates nothing.
func TestRetryAfterRejectionAllocatesNothing(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithSignal(&fixed{u: 2}, admission.DefaultThresholds()))
	for range 30 {
		f.Advance(100 * time.Millisecond)
		retryAfter(t, c, criticality.Sheddable)
	}
	var tk admission.Ticket
	if n := testing.AllocsPerRun(100, func() { tk = admission.Ticket{}; _ = c.Arrive(&tk, criticality.Sheddable, 0, time.Time{}, 0) }); n != 0 {
		t.Fatalf("%v allocations per rejection", n)
	}
}

// The attempt histogram counts arrivals by criticality and attempt
// counter (2 and more in the last bucket), rejected or not.
func TestAttemptHistogram(t *testing.T) {
	f := clock.NewFake(epoch)
	c := mustNew(t, admission.WithClock(f), admission.WithSignal(&fixed{}, admission.DefaultThresholds()))
	want := [criticality.NumLevels][admission.AttemptBuckets]uint64{}
	for i, n := range []int{0, 0, 0, 1, 1, 2, 3} {
		l := criticality.Level(i % criticality.NumLevels)
		var tk admission.Ticket
		if err := c.Arrive(&tk, l, n, time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
		c.Done(&tk)
		want[l][min(n, 2)]++
	}
	if got := c.Stats().Attempts; got != want {
		t.Fatalf("Stats().Attempts = %v, want %v", got, want)
	}
}
