package signals

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/clock"
)

// Reported is a utilization another party measures and reports, such as
// the load an upstream service sends in its responses (ORCA's load
// report; package triagesidecar reads it): Set records a reading, and
// Utilization is the last one until it is older than the max age, then 0,
// for a reading nobody renews says nothing about the load now.
//
// Create one with NewReported; the zero value is not usable. It is safe
// for concurrent use and holds one reading; Set and Utilization each read
// the clock once.
type Reported struct {
	name   string
	maxAge int64 // ns
	since  func() time.Duration
	value  atomic.Uint64 // float64 bits
	at     atomic.Int64  // when value was set, ns on since's scale; 0: never
}

// NewReported returns a Reported named name whose readings count for
// maxAge after they are set, on clk (nil: the real clock).
func NewReported(name string, maxAge time.Duration, clk clock.Clock) (*Reported, error) {
	if name == "" || maxAge <= 0 {
		return nil, fmt.Errorf("%w: a reported signal needs a name and a positive max age, got %q and %v", ErrConfig, name, maxAge)
	}
	clk = clock.OrReal(clk)
	// since starts one nanosecond in the past, so that a reading set at
	// once is told from none.
	return &Reported{name: name, maxAge: int64(maxAge), since: clock.SinceFunc(clk, clk.Now().Add(-time.Nanosecond))}, nil
}

// Name implements Signal.
func (r *Reported) Name() string { return r.name }

// Set records u, a utilization as a fraction of the reporter's target.
// A value that is not a finite number at least 0 is ignored.
func (r *Reported) Set(u float64) {
	if !(u >= 0) || math.IsInf(u, 0) {
		return
	}
	r.value.Store(math.Float64bits(u))
	r.at.Store(int64(r.since()))
}

// Utilization implements Signal: the last reading, or 0 if there is none
// younger than the max age.
func (r *Reported) Utilization() float64 {
	at := r.at.Load()
	if at == 0 || int64(r.since())-at > r.maxAge {
		return 0
	}
	return math.Float64frombits(r.value.Load())
}
