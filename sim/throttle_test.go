package sim

import (
	"math"
	"testing"
)

// The book's claim on a fixed seed: at K = 2 the backend rejects about one
// request per request it accepts (within 15%) once demand exceeds K times
// capacity, at most demand-1 below it; and clients notice a recovered
// backend within seconds.
func TestThrottleScenario(t *testing.T) {
	r, err := Throttle(ThrottleConfig{Ks: []float64{2, 4}, Demands: []float64{2, 10}, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		want, tol float64
	}{
		{"rejects per accept, K=2, 10x", 1, 0.15},
		{"rejects per accept, K=2, 2x", 1, 0.15},
		{"rejects per accept, K=4, 2x", 1, 0.05},
	} {
		h, ok := r.Headline(tc.name)
		if !ok {
			t.Fatalf("no headline %q", tc.name)
		}
		if h.Book == nil || *h.Book != tc.want || math.Abs(h.Value-tc.want) > tc.tol {
			t.Errorf("%s: %.3f (book %v), want %v ± %v", tc.name, h.Value, h.Book, tc.want, tc.tol)
		}
	}
	if h, _ := r.Headline("recovery seconds, K=2"); h.Value > 15 {
		t.Errorf("K=2: clients took %.1f s to notice the recovery", h.Value)
	}
	if _, err := Throttle(ThrottleConfig{Ks: []float64{0.5}}); err == nil {
		t.Error("K below 1 accepted")
	}
}
