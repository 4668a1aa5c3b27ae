// Package throttle implements client-side adaptive throttling, SRE book
// ch. 21, "Client-Side Throttling".
//
// Each client keeps, over a trailing window (the book: "the last two
// minutes"), the number of requests the application attempted and the number
// the backend accepted, separately per criticality ("The adaptive throttling
// system also keeps separate stats for each criticality"). A new request is
// rejected locally, without touching the network, with probability
//
//	max(0, (requests - K*accepts) / (requests + 1))
//
// With K = 2 the backend ends up rejecting about one request per request it
// accepts; lower K is more aggressive. Locally rejected requests still count
// as requests, so the rejection probability grows with the overload.
//
// This package is the transport-free core; adapters (triagegrpc,
// triagehttp) call Allow before sending and Accepted when the backend did
// not reject the request.
package throttle

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
)

// Defaults, from the book.
const (
	// DefaultK is the book's K: "Typically, 2x". The backend then rejects
	// about one request per accepted request in steady overload.
	DefaultK = 2.0
	// DefaultWindow is the book's "last two minutes".
	DefaultWindow = 2 * time.Minute
	// DefaultBuckets is how many slices the window is cut into. The oldest
	// slice is weighted by how much of it is still inside the window, so the
	// count slides smoothly instead of dropping a whole bucket at once.
	DefaultBuckets = 24
)

// MaxBuckets bounds the number of buckets (and so a Throttle's memory and
// the cost of a decision).
const MaxBuckets = 64

// Throttle is an adaptive throttle for one client. Its memory is fixed at
// New: criticality.NumLevels x (buckets+1) x 2 words. It is safe for
// concurrent use without locks: every counter is an atomic word that holds
// its bucket's epoch and count together.
//
// Use Allow before each request and Accepted after each request the backend
// accepted (any answer that is not an overload or quota rejection).
type Throttle struct {
	k      float64
	width  int64 // bucket width in ns
	n      int64 // buckets in the window
	clock  clock.Clock
	random func() float64
	levels [criticality.NumLevels]ring
}

type ring struct {
	requests []atomic.Uint64
	accepts  []atomic.Uint64
}

// Option configures a Throttle.
type Option interface{ apply(*config) }

type config struct {
	k       float64
	window  time.Duration
	buckets int
	clock   clock.Clock
	random  func() float64
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithK sets K (must be >= 1). Default DefaultK.
func WithK(k float64) Option { return optionFunc(func(c *config) { c.k = k }) }

// WithWindow sets the trailing window (at least 1 s). Default DefaultWindow.
func WithWindow(d time.Duration) Option { return optionFunc(func(c *config) { c.window = d }) }

// WithBuckets sets how many buckets the window is cut into (2..MaxBuckets).
// Default DefaultBuckets.
func WithBuckets(n int) Option { return optionFunc(func(c *config) { c.buckets = n }) }

// WithClock sets the clock. Default clock.Real().
func WithClock(c clock.Clock) Option { return optionFunc(func(cfg *config) { cfg.clock = c }) }

// WithRandom sets the source of uniform numbers in [0, 1) used for the
// rejection draw; it must be safe for concurrent use if the Throttle is
// used concurrently. Default: math/rand/v2's lock-free global source. The
// simulator passes a seeded source.
func WithRandom(f func() float64) Option { return optionFunc(func(c *config) { c.random = f }) }

// ErrConfig is wrapped by every error New returns.
var ErrConfig = errors.New("throttle: invalid config")

// New returns a Throttle.
func New(opts ...Option) (*Throttle, error) {
	c := config{k: DefaultK, window: DefaultWindow, buckets: DefaultBuckets}
	for _, o := range opts {
		o.apply(&c)
	}
	switch {
	case !(c.k >= 1) || c.k > 1e6:
		return nil, fmt.Errorf("%w: K must be in [1, 1e6], got %v", ErrConfig, c.k)
	case c.window < time.Second:
		return nil, fmt.Errorf("%w: window must be at least 1s, got %v", ErrConfig, c.window)
	case c.buckets < 2 || c.buckets > MaxBuckets:
		return nil, fmt.Errorf("%w: buckets must be in [2, %d], got %d", ErrConfig, MaxBuckets, c.buckets)
	}
	t := &Throttle{
		k:      c.k,
		width:  int64(c.window) / int64(c.buckets),
		n:      int64(c.buckets),
		clock:  clock.OrReal(c.clock),
		random: c.random,
	}
	if t.random == nil {
		t.random = rand.Float64
	}
	for i := range t.levels {
		t.levels[i] = ring{
			requests: make([]atomic.Uint64, c.buckets+1),
			accepts:  make([]atomic.Uint64, c.buckets+1),
		}
	}
	return t, nil
}

// Words pack a bucket's epoch (high 24 bits) with its count (low 40 bits).
const (
	countBits = 40
	countMask = 1<<countBits - 1
	epochMask = 1<<(64-countBits) - 1
)

// add increments the counter of epoch e in slot s, restarting it if the
// slot still holds an older epoch.
func add(s *atomic.Uint64, e int64) {
	tag := uint64(e) & epochMask
	for {
		old := s.Load()
		var nw uint64
		if old>>countBits == tag {
			if old&countMask == countMask {
				return // saturated; cannot happen in 2 minutes at any real rate
			}
			nw = old + 1
		} else {
			nw = tag<<countBits | 1
		}
		if s.CompareAndSwap(old, nw) {
			return
		}
	}
}

// count returns the count of slot s if it holds epoch e, else 0.
func count(s *atomic.Uint64, e int64) float64 {
	w := s.Load()
	if w>>countBits != uint64(e)&epochMask {
		return 0
	}
	return float64(w & countMask)
}

// sum returns the windowed count of slots at nanosecond time ns: the last n
// buckets in full (the current one included) plus the part of the bucket
// before them that is still inside the window.
func (t *Throttle) sum(slots []atomic.Uint64, ns int64) float64 {
	cur := ns / t.width
	size := int64(len(slots))
	oldest := cur - t.n
	i := mod(oldest, size)
	oldCount := count(&slots[i], oldest)
	var total uint64
	for e := oldest + 1; e <= cur; e++ {
		i++
		if i == size {
			i = 0
		}
		w := slots[i].Load()
		if w>>countBits == uint64(e)&epochMask {
			total += w & countMask
		}
	}
	frac := 1 - float64(ns-cur*t.width)/float64(t.width)
	return float64(total) + frac*oldCount
}

func mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// Allow records a request of level l and decides whether to send it. It
// returns false when the request must be rejected locally.
func (t *Throttle) Allow(l criticality.Level) bool { return t.AllowAt(l, t.clock.Now()) }

// AllowAt is Allow at time now.
func (t *Throttle) AllowAt(l criticality.Level, now time.Time) bool {
	if !l.Valid() {
		l = criticality.Default
	}
	ns := now.UnixNano()
	r := &t.levels[l]
	// Decide on the history, then count this request (rejected or not).
	p := t.probability(r, ns)
	add(&r.requests[mod(ns/t.width, int64(len(r.requests)))], ns/t.width)
	return p <= 0 || t.random() >= p
}

// Accepted records that the backend accepted a request of level l.
func (t *Throttle) Accepted(l criticality.Level) { t.AcceptedAt(l, t.clock.Now()) }

// AcceptedAt is Accepted at time now.
func (t *Throttle) AcceptedAt(l criticality.Level, now time.Time) {
	if !l.Valid() {
		l = criticality.Default
	}
	ns := now.UnixNano()
	r := &t.levels[l]
	add(&r.accepts[mod(ns/t.width, int64(len(r.accepts)))], ns/t.width)
}

func (t *Throttle) probability(r *ring, ns int64) float64 {
	req := t.sum(r.requests, ns)
	acc := t.sum(r.accepts, ns)
	p := (req - t.k*acc) / (req + 1)
	if p < 0 {
		return 0
	}
	return p
}

// Stats is a snapshot of one criticality's window.
type Stats struct {
	Requests, Accepts float64
	// RejectProbability is the probability the next request is rejected
	// locally (before counting it).
	RejectProbability float64
}

// StatsAt returns the window of level l at time now, for metrics and tests.
func (t *Throttle) StatsAt(l criticality.Level, now time.Time) Stats {
	if !l.Valid() {
		l = criticality.Default
	}
	ns := now.UnixNano()
	r := &t.levels[l]
	return Stats{Requests: t.sum(r.requests, ns), Accepts: t.sum(r.accepts, ns), RejectProbability: t.probability(r, ns)}
}
