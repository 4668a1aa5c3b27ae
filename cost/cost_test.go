package cost

import (
	"math"
	"runtime"
	"sync"
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

// serial runs one request after another on r for ms milliseconds of
// virtual time, each 100 ms long, calling tick each millisecond (nil:
// nothing); r is begun again at each end, and the last cost is returned.
func serial(m *Meter, clk *clock.Fake, r *Request, ms int, tick func()) (last time.Duration) {
	for i := 1; i <= ms; i++ {
		clk.Advance(time.Millisecond)
		if tick != nil {
			tick()
		}
		if i%100 == 0 {
			last = m.End(r)
			m.Begin(r)
		}
	}
	return last
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

// A machine of half the reference speed (WithSpeed(0.5)) charges half
// its CPU-seconds: costs are in normalised CPU-seconds, so a request that
// takes twice the CPU on a machine half as fast costs the same.
func TestSpeedNormalisesCost(t *testing.T) {
	cost := func(speed float64, cores float64) time.Duration {
		clk := clock.NewFake(time.Unix(0, 0))
		cpu := &fakeCPU{clk: clk, start: clk.Now(), cores: cores}
		m, err := New(WithClock(clk), WithCPU(cpu.read), WithSpeed(speed))
		if err != nil {
			t.Fatal(err)
		}
		var r Request
		return serial(m, clk, &r, 2000, nil) // one request always active, 100 ms each
	}
	fast := cost(1, 1)   // the reference machine: 100 ms of CPU
	slow := cost(0.5, 2) // the same work takes twice the CPU
	if math.Abs(fast.Seconds()-0.1) > 0.002 || math.Abs(slow.Seconds()-fast.Seconds()) > 0.002 {
		t.Fatalf("reference machine %v, half-speed machine %v: want both 100ms", fast, slow)
	}
}

func TestMeasureSpeed(t *testing.T) {
	f, err := MeasureSpeed(20 * time.Millisecond)
	if err != nil || !(f > 0) || math.IsInf(f, 0) {
		t.Fatalf("MeasureSpeed = %v, %v", f, err)
	}
	for _, d := range []time.Duration{time.Millisecond, time.Minute} {
		if _, err := MeasureSpeed(d); err == nil {
			t.Errorf("MeasureSpeed(%v) accepted", d)
		}
	}
}

func TestNewRefusesBadInput(t *testing.T) {
	if _, err := New(WithWindow(time.Millisecond)); err == nil {
		t.Error("a 1 ms window")
	}
	for _, f := range []float64{0, -1, 101, math.NaN()} {
		if _, err := New(WithSpeed(f)); err == nil {
			t.Errorf("speed %v", f)
		}
	}
	if _, err := New(WithCPU(func() (time.Duration, error) { return 0, errTest })); err == nil {
		t.Error("an unreadable CPU clock")
	}
}

var errTest = errorString("no CPU here")

type errorString string

func (e errorString) Error() string { return string(e) }

// frozenCPU is a process on one fully used core whose CPU time stops
// while it is frozen (SIGSTOP, a VM paused), from `from` to `end`.
type frozenCPU struct {
	clk       *clock.Fake
	start     time.Time
	from, end time.Time
}

func (f *frozenCPU) read() (time.Duration, error) {
	now := f.clk.Now()
	d := now.Sub(f.start)
	if now.After(f.from) {
		until := now
		if until.After(f.end) {
			until = f.end
		}
		d -= until.Sub(f.from)
	}
	return d, nil
}

// A process frozen for 5 s (the drill's storm: the DB tier SIGSTOPped)
// used no CPU meanwhile, and the requests it held through the stop are
// not charged for it. Charged at the rate from before the stop, each of
// them cost 5 s of CPU, and their customers were out of quota for
// seconds after the process came back.
func TestFrozenProcessChargesNoCPU(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	start := clk.Now()
	cpu := &frozenCPU{clk: clk, start: start, from: start.Add(2 * time.Second), end: start.Add(7 * time.Second)}
	m, err := New(WithClock(clk), WithCPU(cpu.read))
	if err != nil {
		t.Fatal(err)
	}
	// One request always active, 100 ms each, before the stop: the rate
	// is one CPU-second per active second.
	var r Request
	m.Begin(&r)
	serial(m, clk, &r, 1950, nil)
	// The request begun at 1.9 s is active 100 ms before the stop and
	// 50 ms after it; nothing in the process runs meanwhile.
	clk.Advance(50 * time.Millisecond) // 2.0 s: the stop
	clk.Advance(5 * time.Second)       // 7.0 s: back
	clk.Advance(50 * time.Millisecond)
	held := m.End(&r)
	if held > 200*time.Millisecond {
		t.Errorf("a request active 150 ms and frozen 5 s with its process: cost %v, want about 150ms (rate %.2f)", held, m.Rate())
	}
	// After the stop the rate is what the process does, not what the
	// frozen requests inflated or deflated.
	m.Begin(&r)
	last := serial(m, clk, &r, 1500, nil)
	if math.Abs(last.Seconds()-0.1) > 0.005 {
		t.Errorf("1.5 s after the stop, a 100 ms request costs %v, want 100ms (rate %.3f)", last, m.Rate())
	}
}

// gatedCPU is frozenCPU whose first reading after the stop waits for
// release, as a reading does when it contends for the process's locks.
type gatedCPU struct {
	frozenCPU
	once             sync.Once
	reading, release chan struct{}
}

func (g *gatedCPU) read() (time.Duration, error) {
	if g.clk.Now().After(g.end) {
		g.once.Do(func() {
			close(g.reading)
			<-g.release
		})
	}
	return g.frozenCPU.read()
}

// Two requests held through a 5 s stop end at once when the process
// continues (the drill's storm: every DB slot's timer fires together).
// One of them closes the buckets of the stop and, while it reads the CPU,
// the other ends too: it must be charged as if the stop had been found,
// not at the rate from before the stop for the whole 5 s (each such
// request cost 5 s, and in one round of eight the customers were 3-5
// times over their limits for 4 s after the stop).
func TestFrozenProcessChargesNoCPUWhileRotating(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	start := clk.Now()
	cpu := &gatedCPU{frozenCPU: frozenCPU{clk: clk, start: start, from: start.Add(2 * time.Second), end: start.Add(7 * time.Second)},
		reading: make(chan struct{}), release: make(chan struct{})}
	m, err := New(WithClock(clk), WithCPU(cpu.read))
	if err != nil {
		t.Fatal(err)
	}
	var r1, r2 Request
	m.Begin(&r1)
	serial(m, clk, &r1, 1950, nil)
	m.Begin(&r2)
	clk.Advance(50 * time.Millisecond) // 2.0 s: the stop
	clk.Advance(5 * time.Second)       // 7.0 s: back
	clk.Advance(50 * time.Millisecond)
	first := make(chan time.Duration)
	go func() { first <- m.End(&r1) }()
	<-cpu.reading // the first End is reading the CPU
	second := make(chan time.Duration)
	go func() { second <- m.End(&r2) }()
	var c2 time.Duration
	released := false
	for waiting := true; waiting; runtime.Gosched() {
		select {
		case c2 = <-second: // it ended while the first read the CPU
			waiting = false
		default:
			if !released && m.waiters.Load() > 0 { // it waits for the reading
				close(cpu.release)
				released = true
			}
		}
	}
	if !released {
		close(cpu.release)
	}
	c1 := <-first
	for i, c := range []time.Duration{c1, c2} {
		if c > 200*time.Millisecond {
			t.Errorf("request %d, active 100 ms and frozen 5 s with its process: cost %v, want about 100ms", i+1, c)
		}
	}
}

// After a pause, requests come in waves: four CPU-bound requests begin
// together 45 ms into a bucket and end together 40 ms later, on four
// cores, and nothing calls the Meter in between. The CPU read when the
// next bucket's first call comes belongs mostly to that bucket, not to
// the one the wave began in. Shared over the buckets since the last
// reading as if it were all the older bucket's, it made that bucket's
// rate eight times the truth, and while the rate rested on it alone each
// 40 ms request was charged 300 ms (the drill's DB after the storm: rates
// of 5-19 for a quarter of a second, customers refused out of quota).
func TestCPUSharedByTimeAfterAPause(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	var cpu time.Duration
	m, err := New(WithClock(clk), WithCPU(func() (time.Duration, error) { return cpu, nil }))
	if err != nil {
		t.Fatal(err)
	}
	// A second of one 100 ms request after another on one core: rate 1.
	var r Request
	m.Begin(&r)
	serial(m, clk, &r, 1000, func() { cpu += time.Millisecond })
	m.End(&r)
	clk.Advance(5*time.Second + 45*time.Millisecond) // idle, then 45 ms into a bucket
	worst, least := time.Duration(0), time.Hour
	for wave := 0; wave < 40; wave++ {
		var rs [4]Request
		for i := range rs {
			m.Begin(&rs[i])
		}
		for range 40 {
			clk.Advance(time.Millisecond)
			cpu += 4 * time.Millisecond
		}
		for i := range rs {
			c := m.End(&rs[i])
			worst, least = max(worst, c), min(least, c)
		}
	}
	if worst > 50*time.Millisecond || least < 30*time.Millisecond {
		t.Errorf("a 40 ms CPU-bound request after a pause cost %v to %v, want about 40ms (rate now %.2f)", least, worst, m.Rate())
	}
}
