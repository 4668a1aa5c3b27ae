package signals_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/signals"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type fixed struct{ u float64 }

func (f *fixed) Name() string         { return "fixed" }
func (f *fixed) Utilization() float64 { return f.u }

// The executor load average swallows a short fan-out burst and trips on
// sustained load (virtual time).
func TestExecutorLoadSmoothsBursts(t *testing.T) {
	f := clock.NewFake(epoch)
	active := 0.5
	sig := signals.ExecutorLoad{Procs: 2, Clock: f, Read: func() float64 { return active }}.Signal()
	th := admission.DefaultThresholds()
	tick := func(d time.Duration) float64 {
		var u float64
		for end := f.Now().Add(d); f.Now().Before(end); f.Advance(time.Millisecond) {
			u = sig.Utilization()
		}
		return u
	}
	tick(5 * time.Second)
	active = 200 // one request fans out into 200 goroutines for 2 ms
	peak := tick(2 * time.Millisecond)
	active = 0.5
	after := tick(10 * time.Millisecond)
	if peak > th.Start[criticality.Sheddable] || after > th.Start[criticality.Sheddable] {
		t.Fatalf("a 2 ms burst of 200 goroutines on 2 procs: utilization %.2f (after %.2f), sheds from %.2f", peak, after, th.Start[criticality.Sheddable])
	}
	active = 3 // sustained: 1.5x the processors
	u := tick(3 * time.Second)
	if u < th.End[criticality.Critical] {
		t.Fatalf("sustained load of 3 on 2 procs: utilization %.2f after 3 s, want past CRITICAL's %.2f", u, th.End[criticality.Critical])
	}
}

func TestCPUAndMemorySignals(t *testing.T) {
	f := clock.NewFake(epoch)
	used := time.Duration(0)
	cpu, err := signals.CPU{CPUs: 2, Clock: f, Read: func() (time.Duration, error) { return used, nil }}.Signal()
	if err != nil {
		t.Fatal(err)
	}
	cpu.Utilization()
	f.Advance(100 * time.Millisecond)
	used += 150 * time.Millisecond // 1.5 CPUs for 100 ms
	if u := cpu.Utilization(); math.Abs(u-0.75) > 1e-9 {
		t.Fatalf("cpu utilization %v, want 0.75", u)
	}
	if _, err := (signals.CPU{Read: func() (time.Duration, error) { return 0, errors.New("no") }}).Signal(); err == nil {
		t.Fatal("a failing reader was accepted")
	}
	mem := signals.Memory{Limit: 1000, Clock: f, Read: func() uint64 { return 900 }}.Signal()
	if u := mem.Utilization(); u != 0.9 {
		t.Fatalf("memory utilization %v", u)
	}
	real, err := signals.CPU{}.Signal()
	if err != nil {
		t.Fatalf("process CPU on this platform: %v", err)
	}
	if u := real.Utilization(); u < 0 || math.IsNaN(u) {
		t.Fatalf("real cpu %v", u)
	}
	if signals.ReservedCPUs() <= 0 {
		t.Fatal("no CPUs reserved")
	}
}

func TestCPUDemandCountsTheWaitForACPU(t *testing.T) {
	f := clock.NewFake(epoch)
	var used, waited time.Duration
	got, err := signals.CPU{CPUs: 1, Clock: f, Read: func() (time.Duration, error) { return used, nil }}.Signal()
	if err != nil {
		t.Fatal(err)
	}
	wanted, err := signals.CPUDemand{CPUs: 1, Clock: f, Read: func() (time.Duration, error) { return used + waited, nil }}.Signal()
	if err != nil {
		t.Fatal(err)
	}
	got.Utilization()
	wanted.Utilization()
	f.Advance(100 * time.Millisecond)
	// A neighbour on the core: the process ran 50 ms and waited 50.
	used, waited = 50*time.Millisecond, 50*time.Millisecond
	if g, w := got.Utilization(), wanted.Utilization(); math.Abs(g-0.5) > 1e-9 || math.Abs(w-1) > 1e-9 {
		t.Fatalf("contended core: CPU %v, CPUDemand %v; want 0.5 and 1", g, w)
	}
	if wanted.Name() != "cpu_demand" {
		t.Fatalf("name %q", wanted.Name())
	}
	real, err := signals.CPUDemand{}.Signal()
	if err != nil {
		t.Fatalf("process CPU demand on this platform: %v", err)
	}
	if u := real.Utilization(); u < 0 || math.IsNaN(u) {
		t.Fatalf("real cpu demand %v", u)
	}
}

func TestCombinedSignals(t *testing.T) {
	a, b := &fixed{0.5}, &fixed{0.9}
	if u := signals.Max("m", a, b).Utilization(); u != 0.9 {
		t.Fatalf("max %v", u)
	}
	w, err := signals.Weighted("w", []signals.Signal{a, b}, []float64{0.5, 0.5})
	if err != nil || math.Abs(w.Utilization()-0.7) > 1e-9 {
		t.Fatalf("weighted %v, %v", w, err)
	}
	if _, err := signals.Weighted("w", []signals.Signal{a}, nil); !errors.Is(err, signals.ErrConfig) {
		t.Fatalf("err %v", err)
	}
}
