package allocate

import (
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/quota"
)

// Option configures an Allocator.
type Option func(*allocatorConfig)

// WithClock sets the Allocator's clock. Default clock.Real().
func WithClock(c clock.Clock) Option { return func(cfg *allocatorConfig) { cfg.clock = c } }

type allocatorConfig struct {
	lease, refresh time.Duration
	maxTasks       int
	maxEntries     int
	clock          clock.Clock
	mode           quota.Mode
	fresh          bool
}

// WithLease sets how long a lease is valid. Default 30 s: long against
// the refresh, so a quota service restart or a few lost refreshes change
// nothing.
func WithLease(d time.Duration) Option {
	return Option(func(c *allocatorConfig) { c.lease = d })
}

// WithRefresh sets how often tasks renew their lease (each with ±25%
// jitter). Default 5 s.
func WithRefresh(d time.Duration) Option {
	return Option(func(c *allocatorConfig) { c.refresh = d })
}

// WithMaxTasks bounds the tasks known. Default 10,000.
func WithMaxTasks(n int) Option {
	return Option(func(c *allocatorConfig) { c.maxTasks = n })
}

// DefaultMaxEntries bounds the customer entries of all live tasks'
// reports together (about 100 bytes each: 1 GB at the bound), so that the
// Allocator's memory is bounded by this, not by MaxTasks times
// quota.MaxReportCustomers.
const DefaultMaxEntries = 10_000_000

// WithMaxEntries bounds the customer entries of all live tasks' reports
// together: a report that would exceed it is refused with ErrTooManyTasks.
// Default DefaultMaxEntries.
func WithMaxEntries(n int) Option {
	return Option(func(c *allocatorConfig) { c.maxEntries = n })
}

// WithMode sets the throttling mode. In quota.ModePessimistic the
// shares of each customer's limit held by the live tasks never sum to more
// than 1: demand is split without the extra floor, and a task's share is
// raised only into room the other tasks have confirmed (a task holds the
// larger of the share last granted to it and the share it last reported
// holding, until it reports the smaller one). Pair it with Enforcers in
// quota.ModePessimistic. Default quota.ModeOptimistic.
func WithMode(m quota.Mode) Option {
	return Option(func(c *allocatorConfig) { c.mode = m })
}

// WithFreshStart tells the Allocator that no grant of an earlier
// Allocator can still be in force (the first leader a replicated service
// ever had): while it learns, a task that reports holding nothing gets the
// safe share in quota.ModePessimistic too, as in quota.ModeOptimistic, where
// otherwise it would get nothing until learning is over.
func WithFreshStart() Option {
	return Option(func(c *allocatorConfig) { c.fresh = true })
}
