// Package measure is the one definition of each figure triage's load
// test, drill and benchmarks report, so that two tables made by different
// tools mean the same thing by p99 or by median:
//
//   - a quantile is the nearest rank: the smallest value with at least a
//     share q of the values at or below it (Quantile);
//   - a median is the middle value, or the mean of the middle two
//     (Median);
//   - a process's memory is its resident set from /proc (RSS, PeakRSS);
//   - an open-loop load sends each request at its time in the schedule,
//     whatever happened to the ones before, its latency counted from that
//     time (loadtest.OpenLoop, which needs a clock and so lives above
//     internal/).
//
// The functions keep no state and are safe for concurrent use.
package measure

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"time"
)

// Quantile returns the q-quantile (0 < q <= 1) of sorted, an ascending
// slice, by nearest rank; NaN for none.
func Quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	return sorted[rank(len(sorted), q)]
}

// QuantileDuration is Quantile of ascending durations; 0 for none.
func QuantileDuration(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[rank(len(sorted), q)]
}

// rank is the index of the nearest-rank q-quantile of n values.
func rank(n int, q float64) int {
	i := int(math.Ceil(q*float64(n))) - 1
	return min(max(i, 0), n-1)
}

// Median returns the median of xs, which it does not modify (the mean of
// the middle two for an even count); NaN for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// RSS returns the resident memory of process pid (0: this process), in
// bytes: VmRSS of /proc/PID/status.
func RSS(pid int) (int64, error) { return status(pid, "VmRSS:") }

// PeakRSS returns the peak resident memory of process pid (0: this
// process), in bytes: VmHWM of /proc/PID/status.
func PeakRSS(pid int) (int64, error) { return status(pid, "VmHWM:") }

// status reads one kB field of /proc/PID/status, in bytes.
func status(pid int, field string) (int64, error) {
	name := "/proc/self/status"
	if pid != 0 {
		name = fmt.Sprintf("/proc/%d/status", pid)
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) >= 2 && string(f[0]) == field {
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("measure: %s %s: %w", name, field, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("measure: no %s in %s", field, name)
}
