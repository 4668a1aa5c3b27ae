package retry

import (
	"math"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/window"
)

// Budget is a per-client retry budget (SRE book ch. 21, "Deciding to
// Retry": "Each client keeps track of the ratio of requests that correspond
// to retries. A request will only be retried as long as this ratio is below
// 10%"). Over a trailing window it counts the client's requests and
// retries, and allows a retry only while retries stay under ratio x
// requests + 1 (the one spare retry lets a quiet client retry its first
// overloaded request): in a total outage a busy client sends about 1.1
// attempts per request instead of 3.
//
// Lower criticality gives way first here too: SHEDDABLE and
// SHEDDABLE_PLUS retries may use only half the budget (retries under
// ratio/2 x requests + 1), so that a stream of sheddable retries never
// leaves a CRITICAL or CRITICAL_PLUS request without its retry.
//
// A Budget is safe for concurrent use and lock-free on the hot path; its
// memory is fixed (one window.Counter). Concurrent callers may overshoot
// the ratio by at most the number of retries decided at the same instant.
type Budget struct {
	ratio float64
	start int64
	since func() time.Duration
	c     *window.Counter // A: requests, B: retries
}

// Budget defaults.
const (
	// DefaultRatio is the book's 10%.
	DefaultRatio = 0.1
	// DefaultBudgetWindow is the trailing window over which the ratio is
	// kept. The book gives none; a minute forgets an old outage quickly and
	// holds enough requests to make the ratio meaningful.
	DefaultBudgetWindow = time.Minute
	budgetBuckets       = 60
)

func newBudget(ratio float64, w time.Duration, c clock.Clock) *Budget {
	start := c.Now()
	return &Budget{
		ratio: ratio,
		start: start.UnixNano(),
		since: clock.SinceFunc(c, start),
		c:     window.New(int64(w/budgetBuckets), budgetBuckets, 1),
	}
}

// NewBudget returns a budget allowing retries up to ratio (in (0, 1]) of
// requests over the trailing window w (at least 1 s); it returns an error
// wrapping ErrConfig otherwise. A nil clock means clock.Real().
func NewBudget(ratio float64, w time.Duration, c clock.Clock) (*Budget, error) {
	if err := checkBudget(ratio, w); err != nil {
		return nil, err
	}
	return newBudget(ratio, w, clock.OrReal(c)), nil
}

func (b *Budget) now() int64 { return b.start + int64(b.since()) }

// Request counts one request (not a retry).
func (b *Budget) Request() { b.request(b.now()) }

func (b *Budget) request(ns int64) { b.c.Add(ns, 1, 0) }

// sheddableShare is the part of the budget the sheddable levels' retries
// may use.
const sheddableShare = 0.5

// TryRetry reports whether one more retry of a request of level l stays
// within the budget, and if so counts it.
func (b *Budget) TryRetry(l criticality.Level) bool { return b.tryRetry(b.now(), l) }

func (b *Budget) tryRetry(ns int64, l criticality.Level) bool {
	w, _ := b.c.Sums(ns)
	ratio := b.ratio
	if l < criticality.Critical {
		ratio *= sheddableShare
	}
	if w.B >= ratio*w.A+1 {
		return false
	}
	b.c.Add(ns, 0, 1)
	return true
}

// Sums returns the requests and retries in the window now.
func (b *Budget) Sums() (requests, retries float64) {
	w, _ := b.c.Sums(b.now())
	return math.Round(w.A*1000) / 1000, math.Round(w.B*1000) / 1000
}
