package admission

import (
	"fmt"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/outcome"
)

// Defaults of WithRetryAfter: the CRE post's "non-critical retryable"
// requests are told to come back after a large interval, so that retries
// stay few while the task sheds them.
const (
	// DefaultRetryAfterMin is how long a sheddable level must have been
	// shed before its rejections carry a RetryAfter, and the first one
	// they carry. A shorter spell is a transient: the book's answer, a
	// retry on another task, is the right one.
	DefaultRetryAfterMin = time.Second
	// DefaultRetryAfterMax bounds the RetryAfter: minutes, as the book
	// allows for batch traffic ("can retry requests minutes or even hours
	// later").
	DefaultRetryAfterMax = 4 * time.Minute
	// retryJitters is the number of jittered variants of each RetryAfter:
	// 1, 7/8, 6/8 and 5/8 of it, so that clients sent away at the same
	// moment come back spread over the last three eighths.
	retryJitters = 4
	// maxRetryBuckets bounds the doublings from min to max.
	maxRetryBuckets = 21
)

// WithRetryAfter sets the RetryAfter of the rejections of SHEDDABLE and
// SHEDDABLE_PLUS requests. Once a level has been shed for min (its
// rejections no more than 2 x min apart), its rejections tell the client
// to retry after min; the wait doubles with every doubling of the spell
// (1 s, 2 s, 4 s... by default), up to max, each answer jittered down by
// up to three eighths. A level not rejected for 2 x min starts over.
// CRITICAL and CRITICAL_PLUS rejections never carry one: their clients
// retry on another task at once, within their budget. WithRetryAfter(0, 0)
// turns it off. Defaults DefaultRetryAfterMin, DefaultRetryAfterMax.
func WithRetryAfter(min, max time.Duration) Option {
	return optionFunc(func(c *config) { c.retryAfterMin, c.retryAfterMax = min, max })
}

// validateRetryAfter checks WithRetryAfter's bounds.
func (c *config) validateRetryAfter() error {
	lo, hi := c.retryAfterMin, c.retryAfterMax
	switch {
	case lo == 0 && hi == 0:
		return nil
	case lo <= 0 || hi < lo || hi > outcome.MaxRetryAfter:
		return fmt.Errorf("%w: retry-after needs 0 < min <= max <= %v (or both 0), got %v, %v", ErrConfig, outcome.MaxRetryAfter, lo, hi)
	case retryBuckets(lo, hi) > maxRetryBuckets:
		return fmt.Errorf("%w: retry-after max may be at most 2^%d x min, got %v, %v", ErrConfig, maxRetryBuckets-1, lo, hi)
	}
	return nil
}

// retryBuckets is the number of RetryAfter values from lo to hi: lo,
// doubled until it reaches hi (the last one is hi).
func retryBuckets(lo, hi time.Duration) int {
	n := 1
	for v := lo; v < hi && n <= maxRetryBuckets; v *= 2 {
		n++
	}
	return n
}

// spell is how long a level has been shed: since is when its current
// spell began, last a recent rejection (kept within interval/16).
type spell struct {
	since, last atomic.Int64
}

// buildErrs prebuilds every rejection the Controller can return: per
// reason and kind, index 0 without RetryAfter, then every bucket's
// jittered variants (retrySlot).
func (c *Controller) buildErrs(lo, hi time.Duration) {
	n := 0
	if lo > 0 {
		n = retryBuckets(lo, hi)
	}
	c.retryMin, c.retryQuiet, c.retryBuckets = int64(lo), 2*int64(lo), n
	for r := Reason(0); r < NumReasons; r++ {
		for dr, kind := range [2]outcome.Kind{outcome.TaskOverloaded, outcome.DontRetry} {
			errs := make([]*outcome.Error, 1+n*retryJitters)
			errs[0] = &outcome.Error{Kind: kind, Reason: r.String()}
			for k := range n {
				v := min(lo<<k, hi)
				for j := range retryJitters {
					errs[1+k*retryJitters+j] = &outcome.Error{Kind: kind, Reason: r.String(), RetryAfter: v * time.Duration(2*retryJitters-j) / (2 * retryJitters)}
				}
			}
			c.errs[r][dr] = errs
		}
	}
	for l := range c.shed {
		c.shed[l].last.Store(-1 << 62)
	}
}

// retrySlot records a rejection of level l at now and returns the index of
// its prebuilt error: 0 (no RetryAfter) for the critical levels and for a
// spell shorter than the minimum.
func (c *Controller) retrySlot(l criticality.Level, now int64) int {
	if c.retryBuckets == 0 || l > criticality.SheddablePlus {
		return 0
	}
	s := &c.shed[l]
	last := s.last.Load()
	if now-last > c.retryQuiet {
		s.since.Store(now)
	}
	if now-last > c.interval/16 {
		s.last.Store(now)
	}
	d := now - s.since.Load()
	if d < c.retryMin {
		return 0
	}
	k := min(bits.Len64(uint64(d/c.retryMin))-1, c.retryBuckets-1)
	j := min(int(c.random()*retryJitters), retryJitters-1)
	return 1 + k*retryJitters + j
}
