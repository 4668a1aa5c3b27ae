package sim

import (
	"testing"
	"time"

	"github.com/triagehq/triage/quota"
)

// A two-level tree of quota servers keeps every over-limit customer's
// global usage at its limit as a single leader does: in ModePessimistic
// never over it, in ModeOptimistic within the two levels' floors (5% each)
// at the 99th percentile, at 1x and 2x tasks and customers, while the root
// answers the regions alone.
func TestQuotaTreeKeepsLimits(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("a minute under the race detector")
	}
	cfg := QuotaTreeConfig{Regions: 4, Tasks: 5, Customers: 40, PerTask: 8, Scale: 2, Duration: 40 * time.Second}
	for _, mode := range []quota.Mode{quota.ModePessimistic, quota.ModeOptimistic} {
		cfg.Mode = mode
		if err := cfg.defaults(); err != nil {
			t.Fatal(err)
		}
		for _, scale := range []int{1, 2} {
			for _, tree := range []bool{false, true} {
				r, err := runQuotaTree(cfg, scale, tree)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%v %s x%d: %d tasks, %d customers: max %.3f, p99 %.3f, served %.3f, %.1f refreshes/s at the top",
					mode, r.layout, scale, r.tasks, r.customers, r.maxRatio, r.p99, r.served, r.rootPerSecond)
				if r.windows == 0 || r.served < 0.85 {
					t.Errorf("%v %s x%d: %d over-limit windows, served %.3f of what the limits allow", mode, r.layout, scale, r.windows, r.served)
				}
				bound := 1.0
				if mode == quota.ModeOptimistic {
					bound = 1.05
					if tree {
						bound = 1.05 * 1.05
					}
				}
				if mode == quota.ModePessimistic && r.maxRatio > bound+1e-9 || r.p99 > bound+1e-9 {
					t.Errorf("%v %s x%d: usage / limit max %.4f, p99 %.4f; bound %.4f", mode, r.layout, scale, r.maxRatio, r.p99, bound)
				}
				top := float64(r.tasks)
				if tree {
					top = float64(cfg.Regions)
				}
				if r.rootPerSecond > top*1.01 {
					t.Errorf("%s: %.1f refreshes/s at the top, want %.0f", r.layout, r.rootPerSecond, top)
				}
			}
		}
	}
}
