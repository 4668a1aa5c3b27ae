package admission_test

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
)

// A ForceShed drill rejects about its fraction of one level, with reason
// Forced, for its time and not after; the other levels are untouched;
// Stats shows it while it lasts; a later call ends it early.
func TestForceShedDrill(t *testing.T) {
	f := clock.NewFake(epoch)
	rng := rand.New(rand.NewPCG(1, 2))
	c := mustNew(t, admission.WithClock(f), admission.WithRandom(rng.Float64), admission.WithRetryAfter(0, 0))
	rejected := func(l criticality.Level, n int) int {
		t.Helper()
		out := 0
		for range n {
			var tk admission.Ticket
			err := c.Arrive(&tk, l, 0, time.Time{}, 0)
			if err != nil {
				if reason(t, err) != admission.Forced {
					t.Fatalf("rejected for %v", err)
				}
				out++
				continue
			}
			c.Done(&tk)
		}
		return out
	}
	if err := c.ForceShed(criticality.SheddablePlus, 0.3, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := c.Stats().Forced; got[criticality.SheddablePlus] != 0.3 || got[criticality.Critical] != 0 {
		t.Fatalf("Stats().Forced = %v", got)
	}
	if n := rejected(criticality.SheddablePlus, 2000); n < 520 || n > 680 {
		t.Fatalf("%d of 2000 SHEDDABLE_PLUS rejected by a 30%% drill", n)
	}
	if n := rejected(criticality.Critical, 500) + rejected(criticality.Sheddable, 500); n != 0 {
		t.Fatalf("%d requests of other levels rejected", n)
	}
	f.Advance(time.Minute)
	if n := rejected(criticality.SheddablePlus, 500); n != 0 || c.Stats().Forced[criticality.SheddablePlus] != 0 {
		t.Fatalf("%d rejected after the drill ended", n)
	}
	if err := c.ForceShed(criticality.CriticalPlus, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	if n := rejected(criticality.CriticalPlus, 100); n != 100 {
		t.Fatalf("%d of 100 rejected by a 100%% drill", n)
	}
	if err := c.ForceShed(criticality.CriticalPlus, 0, 0); err != nil {
		t.Fatal(err)
	}
	if n := rejected(criticality.CriticalPlus, 100); n != 0 {
		t.Fatalf("%d rejected after the drill was ended", n)
	}
	for _, bad := range []struct {
		l criticality.Level
		f float64
		d time.Duration
	}{{criticality.NumLevels, 0.5, time.Minute}, {criticality.Sheddable, 1.5, time.Minute}, {criticality.Sheddable, -0.1, time.Minute},
		{criticality.Sheddable, 0.5, -time.Second}, {criticality.Sheddable, 0.5, admission.MaxForceShed + 1}} {
		if err := c.ForceShed(bad.l, bad.f, bad.d); !errors.Is(err, admission.ErrConfig) {
			t.Errorf("ForceShed(%v, %v, %v) = %v", bad.l, bad.f, bad.d, err)
		}
	}
}
