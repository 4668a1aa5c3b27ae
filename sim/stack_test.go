package sim

import (
	"math"
	"testing"
)

// Figure 21-2 on a fixed seed: with the DB frontend rejecting everything,
// retries at every layer reach it 27 times per user request, triage's rule
// 3 times, and with the retry budget about 1.1.
func TestStackScenario(t *testing.T) {
	r, err := Stack(StackConfig{Requests: 2000, DBRejects: []float64{1}, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		want, tol float64
	}{
		{"DB attempts per request, DB rejecting 100%, retries at every layer", 27, 0},
		{"DB attempts per request, DB rejecting 100%, triage's rule", 3, 0},
		{"DB attempts per request, DB rejecting 100%, triage's rule + budget", 1.1, 0.02},
	} {
		h, ok := r.Headline(tc.name)
		if !ok {
			t.Fatalf("no headline %q", tc.name)
		}
		if math.Abs(h.Value-tc.want) > tc.tol || h.Book == nil {
			t.Errorf("%s: %.3f (book %v), want %v ± %v", tc.name, h.Value, h.Book, tc.want, tc.tol)
		}
	}
	if _, err := Stack(StackConfig{DBRejects: []float64{2}}); err == nil {
		t.Error("a rejection share of 2 accepted")
	}
}
