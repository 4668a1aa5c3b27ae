package admission

import (
	"testing"
)

func TestPendingRuleSteps(t *testing.T) {
	r := pendingRule{target: 5000, floor: milli / 10, ceiling: 80 * milli, maxDelay: 50000}
	const saturated = 1.0
	for _, tc := range []struct {
		name       string
		cap, delay int64
		hit        bool
		busy       float64
		want       int64
	}{
		{"over target: down by a tenth", 20 * milli, 5001, false, saturated, 18 * milli},
		{"over target, small cap: down by a tenth of a request", 500, 9000, true, saturated, 400},
		{"never below the floor", 150, 9000, false, saturated, milli / 10},
		{"cap hit well under target: up by a tenth", 20 * milli, 2499, true, saturated, 22 * milli},
		{"cap hit, small cap: up by a tenth of a request", 500, 0, true, saturated, 600},
		{"never above the ceiling", 79 * milli, 0, true, saturated, 80 * milli},
		{"cap hit between half the target and the target: hold", 20 * milli, 2500, true, saturated, 20 * milli},
		{"under target without a hit: hold", 20 * milli, 0, false, saturated, 20 * milli},
		{"95% busy is saturated", 20 * milli, 9000, true, 0.95, 18 * milli},
		{"over target, CPU not saturated: hold", 20 * milli, 9000, false, 0.5, 20 * milli},
		{"CPU 94% busy, cap hit: up by four times the 6% idle", 20 * milli, 9000, true, 0.94, 24800},
		{"CPU 80% busy, cap hit: up by four times the 20% idle", 20 * milli, 9000, true, 0.8, 36 * milli},
		{"CPU 94.9% busy: four times 5.1%", 20 * milli, 2500, true, 0.949, 24080},
		{"CPU 75% busy or less, cap hit: doubles at most", 10 * milli, 0, true, 0.75, 20 * milli},
		{"CPU idle, cap hit: doubles", 10 * milli, 0, true, 0, 20 * milli},
		{"CPU idle, large cap hit: the ceiling", 50 * milli, 0, true, 0, 80 * milli},
		{"a busy share below 0 (a broken signal) still doubles at most", 10 * milli, 0, true, -3, 20 * milli},
		{"a busy share past 1 (a coarse signal) is saturated", 20 * milli, 9000, true, 1.3, 18 * milli},
		{"a wait past the max wait is a queue whatever the CPU reads: down", 20 * milli, 50001, true, 0.5, 18 * milli},
		{"a wait of the max wait, CPU idle: still a burst, up", 10 * milli, 50000, true, 0.5, 20 * milli},
	} {
		if got := r.step(tc.cap, tc.delay, tc.hit, tc.busy, 0); got != tc.want {
			t.Errorf("%s: step(%d, %d, %v, %v) = %d, want %d", tc.name, tc.cap, tc.delay, tc.hit, tc.busy, got, tc.want)
		}
	}
}

// The cap grows for an idle CPU only up to the max wait's worth of work:
// a signal that misreads a contended CPU as idle cannot take it to the
// ceiling.
func TestPendingRuleGrowsForIdleCPUUpToTheMaxWaitsWork(t *testing.T) {
	r := pendingRule{target: 5000, floor: milli / 10, ceiling: 80 * milli, maxDelay: 50000}
	for _, tc := range []struct {
		name           string
		cap, svc, want int64
	}{
		{"far below: doubles", 10 * milli, 1000, 20 * milli},
		{"near the bound: to it", 40 * milli, 1000, 50 * milli},
		{"2 ms requests: 25 of them", 20 * milli, 2000, 25 * milli},
		{"above the bound (grown before): held, not cut", 60 * milli, 1000, 60 * milli},
		{"service time unknown: the ceiling bounds it", 50 * milli, 0, 80 * milli},
		{"requests longer than the max wait: the bound is the floor, the cap held", 500, 100000, 500},
	} {
		if got := r.step(tc.cap, 0, true, 0, tc.svc); got != tc.want {
			t.Errorf("%s: step(%d, svc %d) = %d, want %d", tc.name, tc.cap, tc.svc, got, tc.want)
		}
	}
}

func TestUsualSteps(t *testing.T) {
	for _, tc := range []struct{ usual, now, want int64 }{
		{0, 3000, 3000},    // up at once
		{3000, 3000, 3000}, // hold
		{5000, 0, 4000},    // down by a fifth of the gap
		{5000, 4000, 4800},
		{4, 0, 4}, // a gap under five thousandths stays
	} {
		if got := usualStep(tc.usual, tc.now); got != tc.want {
			t.Errorf("usualStep(%d, %d) = %d, want %d", tc.usual, tc.now, got, tc.want)
		}
	}
}
