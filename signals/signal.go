// Package signals holds the utilization signals local to a task (SRE book
// ch. 21, "Utilization Signals"), which admission control sheds by: the
// process's CPU against its reservation (CPU), its memory against its
// limit (Memory), the executor load average (ExecutorLoad), and
// combinations of them (Max, Weighted, Sampled).
//
// A Signal reads as a fraction of its target: 1 means at target. The
// values here are safe for concurrent use, and each reading is sampled at
// most once per interval on the request path; they hold no memory that
// grows. Give one to admission.WithSignal with its thresholds.
package signals

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/clock"
)

// ErrConfig is wrapped by every configuration error of the package.
var ErrConfig = errors.New("signals: invalid configuration")

// Signal is a utilization signal local to the task (SRE book ch. 21,
// "Utilization Signals"). Utilization returns the current value as a
// fraction of the signal's target: 1 means at target. Implementations must
// be cheap (the controller asks on every arrival) and safe for concurrent
// use; Sampled wraps an expensive reading so that it is taken at most once
// per interval.
type Signal interface {
	// Name is a short, fixed name for metrics, e.g. "cpu".
	Name() string
	// Utilization is the value as a fraction of the target.
	Utilization() float64
}

// Max combines signals: its utilization is the highest of theirs, so the
// task sheds when any single signal passes its target.
func Max(name string, signals ...Signal) Signal { return maxSignal{name, signals} }

type maxSignal struct {
	name    string
	signals []Signal
}

func (m maxSignal) Name() string { return m.name }

func (m maxSignal) Utilization() float64 {
	u := 0.0
	for _, s := range m.signals {
		u = max(u, s.Utilization())
	}
	return u
}

// Weighted combines signals into one: the weighted sum of their
// utilizations, for a combined target ("reject requests that would surpass
// the combined ... target utilization thresholds"). Weights usually sum
// to 1.
func Weighted(name string, signals []Signal, weights []float64) (Signal, error) {
	if len(signals) == 0 || len(signals) != len(weights) {
		return nil, fmt.Errorf("%w: Weighted needs one weight per signal", ErrConfig)
	}
	for _, w := range weights {
		if !(w >= 0) || math.IsInf(w, 0) {
			return nil, fmt.Errorf("%w: weights must be finite and >= 0, got %v", ErrConfig, w)
		}
	}
	return weighted{name, signals, weights}, nil
}

type weighted struct {
	name    string
	signals []Signal
	weights []float64
}

func (w weighted) Name() string { return w.name }

func (w weighted) Utilization() float64 {
	u := 0.0
	for i, s := range w.signals {
		u += w.weights[i] * s.Utilization()
	}
	return u
}

// Sampled returns a Signal that calls read at most once per interval, on
// the first Utilization call after the interval has passed (no background
// goroutine), and otherwise returns the last reading. Concurrent callers
// never wait: one of them reads, the others use the previous value.
func Sampled(name string, interval time.Duration, c clock.Clock, read func(now time.Time) float64) Signal {
	c = clock.OrReal(c)
	start := c.Now()
	s := &sampled{name: name, interval: int64(interval), read: read, start: start, since: clock.SinceFunc(c, start)}
	s.next.Store(math.MinInt64)
	return s
}

type sampled struct {
	name     string
	interval int64
	read     func(time.Time) float64
	start    time.Time
	since    func() time.Duration
	next     atomic.Int64 // ns since start of the next reading
	value    atomic.Uint64
	mu       sync.Mutex
}

func (s *sampled) Name() string { return s.name }

func (s *sampled) Utilization() float64 {
	now := int64(s.since())
	if now >= s.next.Load() && s.mu.TryLock() {
		if now >= s.next.Load() {
			s.value.Store(math.Float64bits(s.read(s.start.Add(time.Duration(now)))))
			s.next.Store(now + s.interval)
		}
		s.mu.Unlock()
	}
	return math.Float64frombits(s.value.Load())
}
