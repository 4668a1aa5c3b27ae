package loadreport

import (
	"errors"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/clock"
)

func TestMeter(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	util := 0.5
	m, err := New(WithClock(clk), WithUtilization(func() float64 { return util }))
	if err != nil {
		t.Fatal(err)
	}
	for s := range 20 { // 100 successes and 10 errors per second for 20 s
		for range 100 {
			m.Record(false)
		}
		for range 10 {
			m.Record(true)
		}
		clk.Set(time.Unix(int64(s+1), 0))
	}
	l := m.Load()
	if math.Abs(l.QPS-100) > 3 || math.Abs(l.EPS-10) > 0.5 || l.Utilization != 0.5 {
		t.Fatalf("load %+v, want 100 qps, 10 eps, 0.5", l)
	}
	util = math.NaN()
	if m.Load().Utilization != 0 {
		t.Fatal("NaN utilization reported")
	}
	if _, err := New(); err != nil && runtime.GOOS == "linux" {
		t.Errorf("a Meter of the process's CPU: %v", err)
	}
	if _, err := New(WithUtilization(func() float64 { return 0 }), WithWindow(time.Millisecond)); err == nil {
		t.Error("a 1ms window")
	}
}

// A Meter's utilization from a CPU time counter covers its rates' window:
// after its callers paused, its rate per unit of utilization (what
// weighted round robin weighs it by) stays what it was. A utilization
// over the last moment reads near 0 after the pause while the rate still
// counts the seconds before it: a capability many times the task's.
func TestMeterUtilizationCoversTheRatesWindow(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	var cpu time.Duration
	m, err := New(WithClock(clk), WithCPUTime(func() (time.Duration, error) { return cpu, nil }, 2))
	if err != nil {
		t.Fatal(err)
	}
	serve := func(d time.Duration) balance.Load { // 100 a second, 5 ms of CPU each
		var l balance.Load
		for end := clk.Now().Add(d); clk.Now().Before(end); {
			clk.Advance(10 * time.Millisecond)
			cpu += 5 * time.Millisecond
			m.Record(false)
			l = m.Load()
		}
		return l
	}
	before := serve(20 * time.Second)
	if math.Abs(before.QPS-100) > 3 || math.Abs(before.Utilization-0.25) > 0.01 {
		t.Fatalf("load %+v, want 100 qps at 0.25 of 2 CPUs", before)
	}
	clk.Advance(5 * time.Second)
	after := serve(10 * time.Millisecond)
	if r := (after.QPS / after.Utilization) / (before.QPS / before.Utilization); math.Abs(r-1) > 0.1 {
		t.Fatalf("after a 5 s pause %+v, before %+v: capability %.2fx", after, before, r)
	}
	clk.Advance(time.Minute)
	if l := m.Load(); l.Utilization != 0 || l.QPS != 0 {
		t.Fatalf("idle for a minute: %+v", l)
	}
	serve(10 * time.Millisecond)
	if u := m.Load().Utilization; u > 0.01 {
		t.Fatalf("one request after a minute idle: utilization %.3f, want about 0", u)
	}
}

// Bad CPU settings are errors at New; a counter that fails later leaves
// the last reading standing.
func TestMeterCPUTimeErrors(t *testing.T) {
	ok := func() (time.Duration, error) { return 0, nil }
	for _, cpus := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		if _, err := New(WithCPUTime(ok, cpus)); err == nil {
			t.Errorf("cpus %v accepted", cpus)
		}
	}
	if _, err := New(WithCPUTime(nil, 2)); err == nil {
		t.Error("WithCPUTime without a counter accepted")
	}
	broken := errors.New("no counter")
	if _, err := New(WithCPUTime(func() (time.Duration, error) { return 0, broken }, 1)); !errors.Is(err, broken) {
		t.Errorf("a counter failing at New: %v", err)
	}
	clk := clock.NewFake(time.Unix(0, 0))
	var cpu time.Duration
	var fail bool
	m, err := New(WithClock(clk), WithCPUTime(func() (time.Duration, error) {
		if fail {
			return 0, broken
		}
		return cpu, nil
	}, 1))
	if err != nil {
		t.Fatal(err)
	}
	for range 40 { // half a CPU for 2 s
		clk.Advance(50 * time.Millisecond)
		cpu += 25 * time.Millisecond
		m.Load()
	}
	fail = true
	clk.Advance(time.Second)
	if u := m.Load().Utilization; math.Abs(u-0.5) > 0.05 {
		t.Fatalf("the counter failing: utilization %.2f, want the last, 0.5", u)
	}
}
