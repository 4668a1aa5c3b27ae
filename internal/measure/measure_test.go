package measure_test

import (
	"math"
	"os"
	"testing"
	"time"

	"github.com/triagehq/triage/internal/measure"
)

func TestQuantileIsTheNearestRank(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct{ q, want float64 }{{0.5, 5}, {0.9, 9}, {0.99, 10}, {1, 10}, {0.01, 1}, {0.55, 6}} {
		if got := measure.Quantile(xs, tc.q); got != tc.want {
			t.Errorf("Quantile(1..10, %v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if !math.IsNaN(measure.Quantile(nil, 0.5)) {
		t.Error("Quantile of none is not NaN")
	}
	ds := []time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond}
	if got := measure.QuantileDuration(ds, 0.99); got != 3*time.Millisecond {
		t.Errorf("QuantileDuration p99 of 3 = %v", got)
	}
	if measure.QuantileDuration(nil, 0.5) != 0 {
		t.Error("QuantileDuration of none is not 0")
	}
}

func TestMedian(t *testing.T) {
	xs := []float64{4, 1, 3, 2}
	if got := measure.Median(xs); got != 2.5 {
		t.Errorf("Median(4 1 3 2) = %v, want 2.5", got)
	}
	if xs[0] != 4 {
		t.Error("Median sorted its argument")
	}
	if got := measure.Median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("Median(3 1 2) = %v", got)
	}
	if !math.IsNaN(measure.Median(nil)) {
		t.Error("Median of none is not NaN")
	}
}

// This process's memory, by its pid and as 0, is read; a process that
// does not exist is an error.
func TestRSS(t *testing.T) {
	for _, pid := range []int{0, os.Getpid()} {
		rss, err := measure.RSS(pid)
		if err != nil || rss < 1<<20 {
			t.Errorf("RSS(%d) = %d, %v", pid, rss, err)
		}
		peak, err := measure.PeakRSS(pid)
		if err != nil || peak < rss/2 {
			t.Errorf("PeakRSS(%d) = %d, %v (RSS %d)", pid, peak, err, rss)
		}
	}
	if _, err := measure.RSS(1 << 30); err == nil {
		t.Error("RSS of no process: no error")
	}
}
