package sim

import (
	"math"
	"testing"
)

// The book's numbers on a fixed seed: retries triple the load when every
// task is overloaded, the 10% per-client budget holds it near 1.1x, and a
// healthy fleet sees no retries.
func TestRetryScenario(t *testing.T) {
	r, err := Retry(RetryConfig{Clients: 50, Requests: 400, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		want, tol float64
	}{
		{"attempts per request, all overloaded, no budget", 3, 0.001},
		{"attempts per request, all overloaded, 10% budget", 1.1, 0.02},
		{"attempts per request, healthy", 1, 0},
	} {
		h, ok := r.Headline(tc.name)
		if !ok {
			t.Fatalf("no headline %q", tc.name)
		}
		if math.Abs(h.Value-tc.want) > tc.tol {
			t.Errorf("%s: %.4f, want %v ± %v", tc.name, h.Value, tc.want, tc.tol)
		}
	}
	if h, _ := r.Headline("attempts per request, a few overloaded, 10% budget"); h.Value < 1.05 || h.Value > 1.12 {
		t.Errorf("a few overloaded: %.3f attempts per request", h.Value)
	}
	if _, err := Retry(RetryConfig{Clients: -1}); err == nil {
		t.Error("negative clients accepted")
	}
}
