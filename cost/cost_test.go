package cost

import (
	"math"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
)

// fakeCPU is a process whose CPU time advances at `cores` per second of
// virtual time.
type fakeCPU struct {
	clk   *clock.Fake
	start time.Time
	cores float64
}

func (f *fakeCPU) read() (time.Duration, error) {
	return time.Duration(float64(f.clk.Now().Sub(f.start)) * f.cores), nil
}

// Ten requests active at once on two fully used cores each get 0.2 CPU per
// second: a request active for 100 ms costs 20 ms; blocked time is free.
func TestCostOnVirtualTime(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	cpu := &fakeCPU{clk: clk, start: clk.Now(), cores: 2}
	m, err := New(WithClock(clk), WithCPU(cpu.read))
	if err != nil {
		t.Fatal(err)
	}
	// Steady state: ten requests, each active for 100 ms then replaced
	// (staggered), for 4 s of virtual time in 1 ms steps. Meanwhile a
	// probe request is active 10 ms, blocked 500 ms, active 10 ms.
	var reqs [10]Request
	for i := range reqs {
		m.Begin(&reqs[i])
	}
	var probe Request
	var last, probeCost time.Duration
	for ms := 1; ms <= 4000; ms++ {
		clk.Advance(time.Millisecond)
		if i := ms % 100; i < len(reqs) {
			last = m.End(&reqs[i])
			m.Begin(&reqs[i])
		}
		switch ms {
		case 3000:
			m.Begin(&probe)
		case 3010:
			m.Block(&probe)
			m.Block(&probe) // extra calls are ignored
		case 3510:
			m.Unblock(&probe)
		case 3520:
			probeCost = m.End(&probe)
		}
	}
	// The probe is an eleventh active request for 20 ms: the rate is then
	// 2/11, and it pays for its active time only.
	if math.Abs(last.Seconds()-0.020) > 0.001 {
		t.Errorf("last cost %v, want 20ms (rate %.3f)", last, m.Rate())
	}
	if math.Abs(probeCost.Seconds()-0.004) > 0.0006 {
		t.Errorf("20 ms active of 520: cost %v, want about 4ms", probeCost)
	}
}

func TestNewRefusesBadInput(t *testing.T) {
	if _, err := New(WithWindow(time.Millisecond)); err == nil {
		t.Error("a 1 ms window")
	}
	if _, err := New(WithCPU(func() (time.Duration, error) { return 0, errTest })); err == nil {
		t.Error("an unreadable CPU clock")
	}
}

var errTest = errorString("no CPU here")

type errorString string

func (e errorString) Error() string { return string(e) }
