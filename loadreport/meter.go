// Package loadreport is the backend's side of load reports (SRE book ch.
// 20, "Weighted Round Robin": "backends include the current observed rates
// of queries and errors per second, in addition to the utilization"): a
// Meter counts the requests a backend answered and the errors, over a
// sliding window, and reads its utilization, for the reports clients'
// balancers (package balance) weigh it by. triagegrpc sends them as ORCA
// reports in trailers and out of band.
package loadreport

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/internal/proc"
	"github.com/triagehq/triage/internal/window"
	"github.com/triagehq/triage/signals"
)

// Meter is a backend's view of its own load, what its load reports
// carry. It counts answered requests and errors over a sliding window
// (default 10 s of 40 buckets), and measures its utilization over the
// same window from a CPU time counter (default the process's), so that
// a report's rates and its utilization describe the same interval; or
// reads utilization from a function (WithUtilization). Memory is fixed:
// the counts and one CPU reading per bucket. Record takes one clock read
// and one atomic add; Load reads the CPU time at most once per bucket
// width. Make one with New; it is safe for concurrent use.
type Meter struct {
	counts      *window.Counter // A: successes, B: errors
	width       time.Duration
	since       func() time.Duration
	utilization func() float64
	cpu         *cpuMarks // nil with WithUtilization
}

// Option configures a Meter.
type Option func(*config)

type config struct {
	window      time.Duration
	clock       clock.Clock
	utilization func() float64
	cpuTime     func() (time.Duration, error)
	cpus        float64
}

// WithWindow sets the window over which rates are measured. Default
// 10 s.
func WithWindow(d time.Duration) Option { return func(c *config) { c.window = d } }

// WithClock sets the Meter's clock. Default clock.Real().
func WithClock(clk clock.Clock) Option { return func(c *config) { c.clock = clk } }

// WithUtilization sets where utilization comes from: a function returning
// the task's utilization, 0 to 1, which should cover the Meter's window:
// a balancer divides the rate by it, and a utilization over a shorter
// interval than the rate's (a task idle for a moment, its rate still
// counting the seconds before) reads as a task of enormous capacity.
// It replaces WithCPUTime's measurement.
func WithUtilization(f func() float64) Option { return func(c *config) { c.utilization = f } }

// WithCPUTime sets the CPU time counter utilization is measured from, and
// the CPUs it is measured against: the utilization is the counter's
// growth over the window, divided by the window and cpus. read returns
// the CPU time used so far; cpus > 0. Default the process's CPU time
// (getrusage) against signals.ReservedCPUs().
func WithCPUTime(read func() (time.Duration, error), cpus float64) Option {
	return func(c *config) { c.cpuTime, c.cpus = read, cpus }
}

// New returns a Meter.
func New(opts ...Option) (*Meter, error) {
	c := config{window: 10 * time.Second}
	for _, o := range opts {
		o(&c)
	}
	if c.window < 40*time.Millisecond {
		return nil, errors.New("loadreport: meter window under 40ms")
	}
	clk := clock.OrReal(c.clock)
	const buckets = 40
	width := c.window / buckets
	m := &Meter{
		counts: window.New(int64(width), buckets, 1), width: width,
		since: clock.SinceFunc(clk, clk.Now()), utilization: c.utilization,
	}
	if c.utilization == nil {
		if c.cpuTime == nil && c.cpus == 0 {
			c.cpuTime, c.cpus = proc.CPU, signals.ReservedCPUs()
		}
		if c.cpuTime == nil {
			return nil, errors.New("loadreport: WithCPUTime needs a CPU time counter")
		}
		if !(c.cpus > 0) || math.IsInf(c.cpus, 0) {
			return nil, fmt.Errorf("loadreport: WithCPUTime's cpus %v, want > 0", c.cpus)
		}
		cpu, err := c.cpuTime()
		if err != nil {
			return nil, fmt.Errorf("loadreport: reading CPU time: %w", err)
		}
		m.cpu = &cpuMarks{read: c.cpuTime, cpus: c.cpus, width: int64(width), marks: make([]atomic.Pointer[cpuMark], buckets+1)}
		m.cpu.marks[0].Store(&cpuMark{epoch: 0, at: 0, cpu: cpu})
	}
	return m, nil
}

// Record counts one answered request; failed says it was an error.
func (m *Meter) Record(failed bool) {
	if failed {
		m.counts.Add(int64(m.since()), 0, 1)
	} else {
		m.counts.Add(int64(m.since()), 1, 0)
	}
}

// Load returns the current report: rates over the window, and the
// utilization over it (WithUtilization's value instead; clamped to
// [0, 10], NaN reads as 0).
func (m *Meter) Load() balance.Load {
	now := int64(m.since())
	w, _ := m.counts.Sums(now)
	// The window is full after its length; before that, rates are over
	// the time elapsed.
	span := min(time.Duration(now), 40*m.width).Seconds()
	span = max(span, m.width.Seconds())
	var u float64
	if m.cpu != nil {
		u = m.cpu.utilization(now)
	} else {
		u = m.utilization()
	}
	if !(u >= 0) {
		u = 0
	}
	return balance.Load{QPS: w.A / span, EPS: w.B / span, Utilization: min(u, 10), Span: time.Duration(span * float64(time.Second))}
}

// cpuMarks holds a CPU time reading per bucket of the window, the first
// taken in it: the utilization over the window is the growth from the
// oldest reading inside it to the newest. A ring of buckets+1 marks.
type cpuMarks struct {
	read  func() (time.Duration, error)
	cpus  float64
	width int64 // ns
	marks []atomic.Pointer[cpuMark]
}

// cpuMark is a CPU time reading at a time (ns since the Meter's start).
type cpuMark struct {
	epoch, at int64
	cpu       time.Duration
}

func (c *cpuMarks) slot(e int64) *atomic.Pointer[cpuMark] {
	n := int64(len(c.marks))
	return &c.marks[(e%n+n)%n]
}

// utilization returns the CPU used from the oldest mark in the window
// (else the last before it) to the newest, over their interval and the
// CPUs; it reads the CPU time when now is in a bucket without a mark,
// and at every call in the Meter's first bucket.
func (c *cpuMarks) utilization(now int64) float64 {
	e := now / c.width
	newest := c.slot(e).Load()
	if newest == nil || newest.epoch != e {
		if cpu, err := c.read(); err == nil {
			newest = &cpuMark{epoch: e, at: now, cpu: cpu}
			c.slot(e).Store(newest)
		} else if newest = c.latest(e); newest == nil {
			return 0
		}
	}
	n := int64(len(c.marks)) - 1
	oldest := newest
	for k := n; k >= 1 && oldest == newest; k-- {
		if p := c.slot(e - k).Load(); p != nil && p.epoch == e-k && p.at < newest.at {
			oldest = p
		}
	}
	if oldest == newest { // idle for a window: from the last mark before it
		oldest = c.latest(e - n)
	}
	if oldest == nil { // the first bucket: from its mark to now
		cpu, err := c.read()
		if oldest, newest = newest, (&cpuMark{at: now, cpu: cpu}); err != nil || now <= oldest.at {
			return 0
		}
	}
	return float64(newest.cpu-oldest.cpu) / float64(newest.at-oldest.at) / c.cpus
}

// latest is the newest mark before bucket e, nil if none.
func (c *cpuMarks) latest(e int64) *cpuMark {
	var best *cpuMark
	for i := range c.marks {
		if p := c.marks[i].Load(); p != nil && p.epoch < e && (best == nil || p.epoch > best.epoch) {
			best = p
		}
	}
	return best
}
