// Package cost estimates the CPU each request consumes, in CPU-seconds:
// SRE book ch. 21, "The Pitfalls of Queries per Second" ("measure capacity
// directly in available resources ... in CPU-seconds") and "Per-Customer
// Limits", which warns that measuring a request's CPU "can be tricky for
// servers that don't use a thread-per-request model". A Go server is such a
// server: a request's goroutine hops between threads, and Go offers no
// per-goroutine CPU clock.
//
// # How it estimates
//
// A request is active from Begin to End except while it is blocked on
// something other than the CPU, as marked with Block/Unblock: its outgoing
// RPCs, I/O, a lock held elsewhere. (With quotas, the server adapters keep
// a Tracker in the request's context, and triage's gRPC client
// interceptor and HTTP Transport mark each outgoing call as a wait on it.)
// The Meter samples the process's CPU time
// (getrusage) and the total active time of all requests over a sliding
// window (default 1 s of 20 buckets), and their ratio is the CPU a request
// gets per second of being active: with two cores and ten active CPU-bound
// requests, 0.2. A request's cost is its active time times that rate,
// taken over its lifetime.
//
// A pause is not activity: whole buckets in which nothing called the Meter
// and the process used less than a tenth of a core (a process frozen by
// SIGSTOP or a paused VM, or one with nothing to do), four or more of them
// in a row (200 ms by default), are charged to no request and left out of
// the rate. Charged at the rate from before it, every request held through
// a 5 s stop cost 5 s of CPU, and its customer was out of quota for
// seconds after the process came back (TestFrozenProcessChargesNoCPU).
//
// This is exact when the runnable requests share the CPUs fairly, which
// Go's scheduler does over a few of its 10 ms time slices. Errors come from
// (1) waits nobody marked, charged as if the request computed (mark them);
// (2) CPU spent outside requests (GC, background goroutines), spread over
// the requests in proportion to their active time, which is what
// normalised cost should do; (3) unfair scheduling within windows shorter
// than a request, which averages out over many requests; (4) Go runs a
// goroutine woken from I/O next (runnext), so CPU-bound requests wait
// longer than their share and are charged a little more, and the
// scheduler's own work for a wait is spread over everyone. The validation
// (TestCostAccuracyOnRealCPU, a measurement run with TRIAGE_MEASURE=1)
// runs classes of 1x, 10x and 100x CPU on both cores, the 10x class with
// two marked 1 ms waits, against each class's CPU per request when it runs
// alone under the same load: within -14.5% to +13.5%; I/O-bound requests
// come out low, long CPU-bound ones high.
//
// # Normalised CPU
//
// Machines differ: a CPU-second of a fast machine does more work than one
// of a slow machine. WithSpeed scales costs by the machine's speed against
// a reference core (ReferenceRate; MeasureSpeed measures it at start-up),
// so that costs, and the quotas and reports built on them, are in
// normalised CPU-seconds that mean the same work on every machine.
//
// # Cost
//
// Begin, Block, Unblock and End each read the monotonic clock once; Block
// and End add to one shared counter. The Meter reads the process CPU once
// per bucket (50 ms), in whichever call crosses the boundary, and shares
// what was used since the last reading over the buckets by the time each
// spent in that span; a call that comes while another is reading goes on
// without waiting, except the first calls after a gap long enough to be a
// pause, which wait for the reading that finds it. Until the first bucket
// closes the rate is 0. Memory is fixed.
package cost

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/internal/proc"
)

// Meter estimates request costs. It is safe for concurrent use.
type Meter struct {
	since   func() time.Duration
	readCPU func() (time.Duration, error)
	width   int64   // bucket width, ns
	speed   float64 // WithSpeed

	mu      sync.Mutex   // held while rotating; guards lastCPU, lastAt and the cpu fields
	epoch   atomic.Int64 // index of the current bucket
	lastCPU time.Duration
	lastAt  int64 // when lastCPU was read, ns
	// ring holds, per bucket of the window, the process CPU used in it and
	// the active time of requests in it. An active segment is added when
	// it ends, split over the buckets it spans (what is older than the
	// window is dropped).
	ring [buckets]bucket
	rate atomic.Uint64 // float64 bits: CPU-seconds per active-second over the window
	// pause is the latest span of whole buckets in which nothing called
	// the Meter and the process used next to no CPU (frozen, or idle):
	// active time in it is neither charged nor counted.
	pause atomic.Pointer[[2]int64]
	// waiters counts calls waiting for another's rotation after a gap.
	waiters atomic.Int32
}

type bucket struct {
	epoch  atomic.Int64
	active atomic.Int64
	cpu    int64
}

const (
	// pauseBuckets is how many whole buckets without a call to the Meter,
	// in which the process used less than a tenth of a core, make a pause.
	pauseBuckets = 4
	buckets      = 20
	// lag is how many of the newest closed buckets the rate leaves out:
	// segments up to lag buckets long (200 ms by default) are whole when
	// their buckets count.
	lag = 4
)

// Option configures a Meter.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	window time.Duration
	clock  clock.Clock
	cpu    func() (time.Duration, error)
	speed  float64
}

// WithWindow sets the sliding window over which the CPU rate per active
// second is measured. Default 1 s.
func WithWindow(d time.Duration) Option { return optionFunc(func(c *config) { c.window = d }) }

// WithClock sets the clock. Default clock.Real().
func WithClock(c clock.Clock) Option { return optionFunc(func(cfg *config) { cfg.clock = c }) }

// WithSpeed sets the machine's speed against the reference core (SRE
// book ch. 21: a "virtual CPU" unit, so that a core of one machine type is
// worth the same as a core of another): costs are multiplied by it, so
// that they are in normalised CPU-seconds, and quotas fed by them hold the
// same work on every machine. Configure it per machine type, or measure
// it at start-up with MeasureSpeed. In (0, 100]; default 1 (costs in this
// machine's CPU-seconds).
func WithSpeed(f float64) Option { return optionFunc(func(c *config) { c.speed = f }) }

// WithCPU sets where the process's CPU time comes from. Default getrusage.
func WithCPU(f func() (time.Duration, error)) Option {
	return optionFunc(func(c *config) { c.cpu = f })
}

// New returns a Meter.
func New(opts ...Option) (*Meter, error) {
	c := config{window: time.Second, cpu: proc.CPU, speed: 1}
	for _, o := range opts {
		o.apply(&c)
	}
	if c.window < buckets*time.Millisecond {
		return nil, errors.New("cost: window under 20 ms")
	}
	if !(c.speed > 0 && c.speed <= 100) {
		return nil, fmt.Errorf("cost: speed %v out of (0, 100]", c.speed)
	}
	cpu, err := c.cpu()
	if err != nil {
		return nil, err
	}
	clk := clock.OrReal(c.clock)
	m := &Meter{since: clock.SinceFunc(clk, clk.Now()), readCPU: c.cpu, width: int64(c.window / buckets), lastCPU: cpu, speed: c.speed}
	return m, nil
}

// Request follows one request. Keep it with the request (it is a value,
// no allocation) and pass it to every call.
type Request struct {
	segStart int64 // start of the current active segment, ns; -1 while blocked
	cost     float64
}

// Begin starts measuring r.
func (m *Meter) Begin(r *Request) {
	*r = Request{segStart: m.now()}
}

// Block marks r as waiting on something other than the CPU (I/O, a
// downstream call, a lock held elsewhere). Calls must alternate with
// Unblock; extra calls are ignored.
func (m *Meter) Block(r *Request) {
	if r.segStart < 0 {
		return
	}
	m.endSegment(r, m.now())
	r.segStart = -1
}

// Unblock marks r as computing again.
func (m *Meter) Unblock(r *Request) {
	if r.segStart >= 0 {
		return
	}
	r.segStart = m.now()
}

// End stops measuring r and returns its estimated cost.
func (m *Meter) End(r *Request) time.Duration {
	if r.segStart >= 0 {
		m.endSegment(r, m.now())
		r.segStart = -1
	}
	return time.Duration(r.cost * float64(time.Second))
}

// Rate returns the current CPU-seconds per active-second (normalised by
// WithSpeed).
func (m *Meter) Rate() float64 { return loadFloat(&m.rate) }

func (m *Meter) endSegment(r *Request, now int64) {
	from := r.segStart
	if now <= from {
		return
	}
	// A pause within the segment is no activity: the process did not run.
	if p := m.pause.Load(); p != nil && p[0] < now && p[1] > from {
		m.file(from, min(now, p[0]))
		r.cost += float64(max(0, min(now, p[0])-from)) / 1e9 * m.Rate()
		from = max(from, p[1])
	}
	m.file(from, now)
	r.cost += float64(max(0, now-from)) / 1e9 * m.Rate()
}

// file adds active time [from, to) to the buckets it spans.
func (m *Meter) file(from, to int64) {
	if to <= from {
		return
	}
	last := to / m.width
	for k := max(from/m.width, last-buckets+1); k <= last; k++ {
		lo, hi := max(from, k*m.width), min(to, (k+1)*m.width)
		if b := &m.ring[k%buckets]; hi > lo && b.epoch.Load() == k {
			b.active.Add(hi - lo)
		}
	}
}

// now reads the clock and closes the bucket if its time is over.
func (m *Meter) now() int64 {
	n := int64(m.since())
	if e := n / m.width; e > m.epoch.Load() {
		m.rotate(e, n)
	}
	return n
}

// rotate closes the buckets up to e, at n: it samples the process CPU,
// files the CPU and the active time of the bucket that ended, and
// recomputes the rate over the window.
func (m *Meter) rotate(e, n int64) {
	if e-m.epoch.Load()-1 >= pauseBuckets {
		// After a gap long enough to be a pause, wait for whoever is
		// rotating: a segment that ends before the pause is found would
		// be charged for it.
		m.waiters.Add(1)
		m.mu.Lock()
		m.waiters.Add(-1)
	} else if !m.mu.TryLock() {
		return // another call is rotating
	}
	defer m.mu.Unlock()
	last := m.epoch.Load()
	if e <= last {
		return
	}
	cpu, err := m.readCPU()
	if err != nil {
		cpu = m.lastCPU
	}
	// Whole buckets nobody called in, with less than a tenth of a core
	// used since the last rotation, are a pause of the process.
	if idle := e - last - 1; idle >= pauseBuckets && 10*int64(cpu-m.lastCPU) < idle*m.width {
		m.pause.Store(&[2]int64{(last + 1) * m.width, e * m.width})
	}
	// The CPU since the last reading, at lastAt, belongs to buckets
	// last..e by the time each spent in [lastAt, n): the reading comes
	// with the first call of a bucket, which may be late in it.
	used, span := int64(cpu-m.lastCPU), max(n-m.lastAt, 1)
	share := func(k int64) int64 {
		return used * max(0, min(n, (k+1)*m.width)-max(m.lastAt, k*m.width)) / span
	}
	for k := max(last, e-buckets+1); k < e; k++ {
		b := &m.ring[k%buckets]
		if k > last { // a bucket nobody touched
			b.cpu = 0
			b.active.Store(0)
			b.epoch.Store(k)
		}
		b.cpu += share(k)
	}
	nb := &m.ring[e%buckets]
	nb.active.Store(0)
	nb.cpu = share(e)
	nb.epoch.Store(e)
	m.lastCPU, m.lastAt = cpu, n
	m.epoch.Store(e)
	// The rate over the closed buckets of the window, leaving out the
	// newest ones: their active time is still arriving, from segments
	// that have not ended (a segment is filed when it ends).
	var c, a int64
	for k := max(e-buckets+1, 0); k < e-lag; k++ {
		if b := &m.ring[k%buckets]; b.epoch.Load() == k {
			c += b.cpu
			a += b.active.Load()
		}
	}
	if a > 0 {
		storeFloat(&m.rate, m.speed*float64(c)/float64(a))
	}
}

func loadFloat(a *atomic.Uint64) float64     { return math.Float64frombits(a.Load()) }
func storeFloat(a *atomic.Uint64, v float64) { a.Store(math.Float64bits(v)) }
