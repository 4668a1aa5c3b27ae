package quota_test

import (
	"math"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/quota"
)

// FuzzLeaseValidate builds leases from arbitrary fields: Validate refuses
// or Leased installs it, and then every limit, while the lease holds and
// after it expires, is a number >= 0.
func FuzzLeaseValidate(f *testing.F) {
	f.Add(int64(30000), int64(5000), 3, "safe", 4000.0, 0.5, 100.0, false, "gmail", true)
	f.Add(int64(1), int64(1), 1, "pessimistic", 0.0, 1.0, -1.0, true, "", false)
	f.Add(int64(86400000), int64(86400000), 10000, "optimistic", math.Inf(1), math.NaN(), 0.0, false, "(other)", false)
	f.Fuzz(func(t *testing.T, leaseMs, refreshMs int64, tasks int, fallback string, cpu, share, by float64, hard bool, customer string, partial bool) {
		ls := quota.Lease{
			Duration: time.Duration(leaseMs) * time.Millisecond, Refresh: time.Duration(refreshMs) * time.Millisecond,
			Fallback: quota.Fallback(fallback), Tasks: tasks, Partial: partial,
			Default: quota.Grant{CPU: cpu / 2, Share: share / 2},
			Grants:  []quota.Grant{{Customer: customer, CPU: cpu, Share: share, Hard: hard, ByCriticality: [criticality.NumLevels]float64{by, 0, by}}},
		}
		if ls.Validate() != nil {
			return
		}
		clk := clock.NewFake(time.Unix(0, 0))
		boot, _ := quota.New(quota.Config{Tasks: 2, Customers: map[string]quota.Limit{"gmail": {CPU: 2}}})
		l := quota.NewLeased(clk, boot)
		if err := l.Set(ls); err != nil {
			t.Fatalf("Validate accepted a lease Set refuses: %v", err)
		}
		for _, when := range []time.Duration{0, ls.Duration} {
			clk.Advance(when)
			for _, c := range []string{customer, "gmail", "stranger"} {
				for lv := range criticality.Level(criticality.NumLevels) {
					if v, _ := l.Limit(c, lv); math.IsNaN(v) || v < 0 {
						t.Fatalf("limit of %q at %v: %v (lease %+v)", c, lv, v, ls)
					}
				}
			}
		}
	})
}
