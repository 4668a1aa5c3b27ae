package loadreport

import (
	"math"
	"testing"
	"time"

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
	if _, err := New(); err == nil {
		t.Error("a Meter without utilization")
	}
	if _, err := New(WithUtilization(func() float64 { return 0 }), WithWindow(time.Millisecond)); err == nil {
		t.Error("a 1ms window")
	}
}
