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
	"time"

	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/internal/window"
)

// Meter is a backend's view of its own load, what its load reports
// carry. It counts answered requests and errors over a sliding window
// (default 10 s of 40 buckets) and reads utilization from a function.
// Memory is fixed; Record takes one clock read and one atomic add. Make
// one with New; it is safe for concurrent use.
type Meter struct {
	counts      *window.Counter // A: successes, B: errors
	width       time.Duration
	since       func() time.Duration
	utilization func() float64
}

// Option configures a Meter.
type Option func(*config)

type config struct {
	window      time.Duration
	clock       clock.Clock
	utilization func() float64
}

// WithWindow sets the window over which rates are measured. Default
// 10 s.
func WithWindow(d time.Duration) Option { return func(c *config) { c.window = d } }

// WithClock sets the Meter's clock. Default clock.Real().
func WithClock(clk clock.Clock) Option { return func(c *config) { c.clock = clk } }

// WithUtilization sets where utilization comes from: a function returning
// the task's utilization, 0 to 1 (for example an signals.CPU signal's
// Utilization). Required.
func WithUtilization(f func() float64) Option { return func(c *config) { c.utilization = f } }

// New returns a Meter.
func New(opts ...Option) (*Meter, error) {
	c := config{window: 10 * time.Second}
	for _, o := range opts {
		o(&c)
	}
	if c.window < 40*time.Millisecond {
		return nil, errors.New("loadreport: meter window under 40ms")
	}
	if c.utilization == nil {
		return nil, errors.New("loadreport: a Meter needs WithUtilization")
	}
	clk := clock.OrReal(c.clock)
	const buckets = 40
	width := c.window / buckets
	return &Meter{
		counts: window.New(int64(width), buckets, 1), width: width,
		since: clock.SinceFunc(clk, clk.Now()), utilization: c.utilization,
	}, nil
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
// utilization function's value (clamped to [0, 10]; NaN reads as 0).
func (m *Meter) Load() balance.Load {
	now := int64(m.since())
	w, _ := m.counts.Sums(now)
	// The window is full after its length; before that, rates are over
	// the time elapsed.
	span := min(time.Duration(now), 40*m.width).Seconds()
	span = max(span, m.width.Seconds())
	u := m.utilization()
	if !(u >= 0) {
		u = 0
	}
	return balance.Load{QPS: w.A / span, EPS: w.B / span, Utilization: min(u, 10), Span: time.Duration(span * float64(time.Second))}
}
