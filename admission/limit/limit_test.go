package limit

import (
	"testing"
	"time"
)

func TestLatencySteps(t *testing.T) {
	r := Latency{Min: 2, Max: 100, Tolerance: 2, ProbeEvery: 50}
	const fresh = 0 // no baseline yet
	for _, tc := range []struct {
		name   string
		s      State
		mean   time.Duration
		own    time.Duration
		waited bool
		want   State
	}{
		{"the first interval probes the baseline at the minimum",
			State{Limit: 8, Baseline: fresh}, 1000, 0, false,
			State{Limit: 2, Baseline: fresh, Probing: true, Resume: 8, Intervals: 1}},
		{"at the minimum already, the first interval is the baseline",
			State{Limit: 2, Baseline: fresh}, 1000, 0, true,
			State{Limit: 2, Baseline: 1000, Intervals: 1}},
		{"the probe's own requests' mean becomes the baseline, the limit comes back",
			State{Limit: 2, Baseline: fresh, Probing: true, Resume: 8, Intervals: 1}, 5000, 900, true,
			State{Limit: 8, Baseline: 900, Resume: 8, Intervals: 2}},
		{"a probe none of whose own requests was measured lasts another interval",
			State{Limit: 2, Baseline: fresh, Probing: true, Resume: 8, Intervals: 1}, 5000, 0, true,
			State{Limit: 2, Baseline: fresh, Probing: true, Probed: 1, Resume: 8, Intervals: 2}},
		{"at most MaxProbe Intervals: then the interval's mean serves",
			State{Limit: 2, Baseline: fresh, Probing: true, Probed: MaxProbe - 1, Resume: 8, Intervals: 5}, 5000, 0, true,
			State{Limit: 8, Baseline: 5000, Resume: 8, Intervals: 6}},
		{"within tolerance with waiting: grow by a tenth, at least one",
			State{Limit: 8, Baseline: 1000, Intervals: 2}, 1999, 0, true,
			State{Limit: 9, Baseline: 1000, Intervals: 3}},
		{"grow by a tenth",
			State{Limit: 50, Baseline: 1000, Intervals: 2}, 1500, 0, true,
			State{Limit: 55, Baseline: 1000, Intervals: 3}},
		{"grow no further than the maximum",
			State{Limit: 99, Baseline: 1000, Intervals: 2}, 1500, 0, true,
			State{Limit: 100, Baseline: 1000, Intervals: 3}},
		{"within tolerance without waiting: hold",
			State{Limit: 8, Baseline: 1000, Intervals: 2}, 1500, 0, false,
			State{Limit: 8, Baseline: 1000, Intervals: 3}},
		{"service time inflated past tolerance: shrink by a tenth, at least one",
			State{Limit: 8, Baseline: 1000, Intervals: 2}, 2001, 0, true,
			State{Limit: 7, Baseline: 1000, Intervals: 3}},
		{"shrink by a tenth",
			State{Limit: 50, Baseline: 1000, Intervals: 2}, 5000, 0, false,
			State{Limit: 45, Baseline: 1000, Intervals: 3}},
		{"shrink no further than the minimum",
			State{Limit: 2, Baseline: 1000, Intervals: 2}, 5000, 0, false,
			State{Limit: 2, Baseline: 1000, Intervals: 3}},
		{"every probeEvery intervals, probe again",
			State{Limit: 30, Baseline: 1000, Intervals: 49}, 1200, 0, true,
			State{Limit: 2, Baseline: 1000, Probing: true, Resume: 30, Intervals: 50}},
	} {
		if got := r.Step(tc.s, Sample{Mean: tc.mean, Probe: tc.own, Waited: tc.waited}); got != tc.want {
			t.Errorf("%s:\n got  %+v\n want %+v", tc.name, got, tc.want)
		}
	}
}

func TestGradientSteps(t *testing.T) {
	r := Gradient{Min: 2, Max: 100, Tolerance: 1.5, Smoothing: 0.2, QueueSize: 4, LongIntervals: 10}
	ms := time.Millisecond
	for _, tc := range []struct {
		name   string
		s      State
		mean   time.Duration
		waited bool
		want   State
	}{
		{"the first interval is the long-term mean; requests waited: grow by queue x smoothing",
			State{Limit: 10}, 10 * ms, true,
			State{Limit: 11, Baseline: 10 * ms, Intervals: 1}},
		{"nobody waited: hold",
			State{Limit: 10, Baseline: 10 * ms}, 10 * ms, false,
			State{Limit: 10, Baseline: 10 * ms, Intervals: 1}},
		{"service time twice the long-term mean: the mean moves to 11 ms, gradient 1.5 x 11/20 = 0.825, 40 x 0.8 + (40 x 0.825 + 4) x 0.2 = 39.4",
			State{Limit: 40, Baseline: 10 * ms}, 20 * ms, false,
			State{Limit: 39, Baseline: 11 * ms, Intervals: 1}},
		{"service time far past it: the gradient stops at 0.5",
			State{Limit: 40, Baseline: 10 * ms}, 100 * ms, true,
			State{Limit: 37, Baseline: 19 * ms, Intervals: 1}},
		{"a long-term mean more than twice the interval's decays faster",
			State{Limit: 40, Baseline: 100 * ms}, 10 * ms, true,
			State{Limit: 41, Baseline: 86500 * time.Microsecond, Intervals: 1}},
		{"within the bounds",
			State{Limit: 100, Baseline: 10 * ms}, 10 * ms, true,
			State{Limit: 100, Baseline: 10 * ms, Intervals: 1}},
		{"nothing measured: nothing learned",
			State{Limit: 10, Baseline: 10 * ms}, 0, true,
			State{Limit: 10, Baseline: 10 * ms, Intervals: 1}},
	} {
		if got := r.Step(tc.s, Sample{Mean: tc.mean, Waited: tc.waited}); got != tc.want {
			t.Errorf("%s:\n got  %+v\n want %+v", tc.name, got, tc.want)
		}
	}
}
