package quota

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota/usage"
)

type demand struct {
	customer string
	level    criticality.Level
	rate     float64 // CPU-seconds per second offered
}

// run is one task on virtual time: every 10 ms each demand offers its
// requests of 1 ms CPU, and the admitted ones are charged to the Usage.
type run struct {
	e   *Enforcer
	u   *usage.Table
	clk *clock.Fake
}

// step runs d and returns, per demand, the requests offered and admitted
// and the CPU served per second.
func (r run) step(t *testing.T, demands []demand, d time.Duration) (offered, admitted, served []float64) {
	t.Helper()
	offered = make([]float64, len(demands))
	admitted = make([]float64, len(demands))
	served = make([]float64, len(demands))
	credit := make([]float64, len(demands))
	for range int(d / (10 * time.Millisecond)) {
		for i, dm := range demands {
			credit[i] += dm.rate * 10 // ms of CPU this step
			for ; credit[i] >= 1; credit[i]-- {
				offered[i]++
				if _, err := r.e.Reserve(dm.customer, dm.level); err != nil {
					if oe, ok := outcome.As(err); !ok || oe.Kind != outcome.OutOfQuota || oe.RetryAfter <= 0 {
						t.Fatalf("refusal %v is not out of quota with a retry-after", err)
					}
					continue
				}
				r.u.Add(dm.customer, dm.level, time.Millisecond)
				admitted[i]++
				served[i] += 0.001 / d.Seconds()
			}
		}
		r.clk.Advance(10 * time.Millisecond)
	}
	return offered, admitted, served
}

func newRun(t *testing.T, c Config, capacity float64) run {
	t.Helper()
	clk := clock.NewFake(time.Unix(0, 0))
	p, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	u, err := usage.New(usage.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	e, err := NewEnforcer(p, u, WithCapacity(capacity), WithEnforcerRandom(rng.Float64))
	if err != nil {
		t.Fatal(err)
	}
	return run{e, u, clk}
}

// The book's proportions scaled down (quotas 4, 4, 3 and 0.5 CPUs on a
// 10-CPU task, oversubscribed): the three large customers stay within
// their quotas (gmail at 97.5% of it) and all but fill the task, the small one sends 5 times its
// quota. Only the abuser is refused, and from the tenth second on what
// it is served each second is within 10% of its quota.
func TestEnforcerRefusesOnlyTheAbuser(t *testing.T) {
	r := newRun(t, Config{Customers: map[string]Limit{
		"gmail": {CPU: 4}, "calendar": {CPU: 4}, "android": {CPU: 3}, "batch": {CPU: 0.5},
	}}, 10)
	demands := []demand{
		{"gmail", criticality.Critical, 3.9}, {"calendar", criticality.Critical, 3.5},
		{"android", criticality.SheddablePlus, 2.5}, {"batch", criticality.Sheddable, 2.5},
	}
	var offered, admitted [4]float64
	for s := range 15 {
		o, a, served := r.step(t, demands, time.Second)
		for i := range 4 {
			offered[i] += o[i]
			admitted[i] += a[i]
		}
		t.Logf("second %2d: abuser served %.3f CPU, τ %.2f", s+1, served[3], r.e.Threshold())
		if s >= 9 && math.Abs(served[3]-0.5)/0.5 > 0.10 {
			t.Errorf("second %d: abuser served %.3f CPU, want its quota 0.5 within 10%%", s+1, served[3])
		}
	}
	for i := range 3 {
		if admitted[i] != offered[i] {
			t.Errorf("%s within quota: %.0f of %.0f admitted", demands[i].customer, admitted[i], offered[i])
		}
	}
	if r.e.Refused(criticality.Sheddable) == 0 || r.e.Refused(criticality.Critical) != 0 {
		t.Errorf("refusals by level: SHEDDABLE %d, CRITICAL %d", r.e.Refused(criticality.Sheddable), r.e.Refused(criticality.Critical))
	}
}

// Work conservation: with spare capacity, an over-quota customer with a
// soft limit is served in full; a hard limit holds regardless.
func TestEnforcerWorkConservingAndHard(t *testing.T) {
	r := newRun(t, Config{Customers: map[string]Limit{"soft": {CPU: 0.5}, "hard": {CPU: 0.5, Hard: true}}}, 10)
	demands := []demand{{"soft", criticality.Sheddable, 2}, {"hard", criticality.Sheddable, 2}}
	r.step(t, demands, 4*time.Second)
	o, a, served := r.step(t, demands, 4*time.Second)
	if a[0] != o[0] || math.Abs(served[0]-2) > 0.01 {
		t.Errorf("soft limit with spare capacity: %.0f of %.0f admitted, served %.2f; want all", a[0], o[0], served[0])
	}
	if served[1] > 0.5*1.02 || served[1] < 0.45 {
		t.Errorf("hard limit 0.5: served %.3f", served[1])
	}
}

// Within one customer, the lower criticality is refused first, and
// CRITICAL_PLUS within quota never is.
func TestEnforcerCriticalityOrder(t *testing.T) {
	r := newRun(t, Config{Customers: map[string]Limit{"ads": {CPU: 2}, "other": {CPU: 8}}}, 10)
	demands := []demand{
		{"ads", criticality.CriticalPlus, 1}, {"ads", criticality.Critical, 0.8}, {"ads", criticality.Sheddable, 3},
		{"other", criticality.Critical, 7.5},
	}
	r.step(t, demands, 6*time.Second)
	o, a, _ := r.step(t, demands, 6*time.Second)
	t.Logf("ads CRITICAL_PLUS %.0f/%.0f, CRITICAL %.0f/%.0f, SHEDDABLE %.0f/%.0f admitted", a[0], o[0], a[1], o[1], a[2], o[2])
	if a[0] != o[0] || a[1] != o[1] || a[2] > 0.15*o[2] || a[3] != o[3] {
		t.Error("want CRITICAL_PLUS and CRITICAL all admitted, SHEDDABLE held to the rest of the quota")
	}
}

// A customer with no limit (an optimistic fallback) is never refused, and
// a bad configuration is refused.
func TestEnforcerConfig(t *testing.T) {
	u, _ := usage.New()
	p, _ := New(Config{})
	if _, err := NewEnforcer(nil, u); err == nil {
		t.Error("no limits")
	}
	for _, o := range []EnforcerOption{WithCapacity(math.NaN()), WithCapacity(-1), withAdjustInterval(0)} {
		if _, err := NewEnforcer(p, u, o); err == nil {
			t.Error("bad option accepted")
		}
	}
	e, _ := NewEnforcer(NewLeased(nil, nil), u, WithOverload(func() bool { return true }))
	for range 1000 {
		if _, err := e.Reserve("x", criticality.Sheddable); err != nil {
			t.Fatal("refused without a limit")
		}
		u.Add("x", criticality.Sheddable, time.Second)
	}
}
