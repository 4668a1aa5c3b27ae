package admission

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
)

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

// Thresholds say, per criticality, where shedding by a signal starts and
// where it is complete: a request of level l is rejected with probability
// rising linearly from 0 at Start[l] to 1 at End[l] (utilization as a
// fraction of the target). Higher criticalities have higher thresholds, so
// as utilization rises SHEDDABLE is shed first, CRITICAL_PLUS last, and no
// class flips on and off.
type Thresholds struct {
	Start, End [criticality.NumLevels]float64
}

// DefaultThresholds shed SHEDDABLE from 80% to 90% of a signal's target,
// SHEDDABLE_PLUS from 85% to 95%, CRITICAL from 90% to 100% and
// CRITICAL_PLUS from 95% to 105%: the book's "higher thresholds for higher
// criticalities", with each class's ramp overlapping the next so that the
// task sheds progressively while the classes above still run.
func DefaultThresholds() Thresholds {
	var t Thresholds
	for l, s := range [criticality.NumLevels]float64{0.80, 0.85, 0.90, 0.95} {
		t.Start[l], t.End[l] = s, s+0.10
	}
	return t
}

func (t Thresholds) validate() error {
	for l := range t.Start {
		if !(t.Start[l] >= 0 && t.End[l] > t.Start[l] && !math.IsInf(t.End[l], 0)) {
			return fmt.Errorf("%w: thresholds for %v: need 0 <= start < end, got %v and %v",
				ErrConfig, criticality.Level(l), t.Start[l], t.End[l])
		}
		if l > 0 && (t.Start[l] < t.Start[l-1] || t.End[l] < t.End[l-1]) {
			return fmt.Errorf("%w: thresholds must not decrease with criticality (%v)", ErrConfig, criticality.Level(l))
		}
	}
	return nil
}

// rejectP returns the probability of rejecting level l at utilization u.
func (t *Thresholds) rejectP(l criticality.Level, u float64) float64 {
	s, e := t.Start[l], t.End[l]
	switch {
	case u <= s:
		return 0
	case u >= e:
		return 1
	}
	return (u - s) / (e - s)
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
