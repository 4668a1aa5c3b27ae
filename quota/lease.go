package quota

import (
	"errors"
	"math"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
)

// Grant is one customer's part of a Lease: the customer's global limit
// (as the policy says) and this task's share of it.
type Grant struct {
	Customer string // "" for the default of every customer not listed
	// CPU is the customer's global limit in CPU-seconds per second, over
	// all criticalities; ByCriticality a lower one per level (0: none).
	CPU           float64
	ByCriticality [criticality.NumLevels]float64
	Hard          bool
	// Share is this task's fraction of the limit, in [0, 1]: the quota
	// service splits each limit in proportion to where the customer's
	// demand lands.
	Share float64
}

// Lease is what the quota service gives a task: its limits for a while.
type Lease struct {
	Grants []Grant // at most one per customer
	// Default applies to customers not in Grants (its Customer is "").
	Default Grant
	// Duration is how long the lease is valid from its receipt; Refresh
	// how often the task should renew it.
	Duration, Refresh time.Duration
	// Fallback and Tasks say what to enforce once the lease has run out:
	// under Safe, each limit divided by Tasks.
	Fallback Fallback
	Tasks    int
	// Partial says that Grants names only the customers the task reported
	// (the policy names more than LeaseNamedCustomers): a customer not in
	// Grants may be one the policy names, so the task enforces for it its
	// bootstrap policy's limit with Default's share if that policy names
	// it, else Default.
	Partial bool
}

func (g Grant) limit(l criticality.Level) float64 {
	cpu := g.CPU
	if l.Valid() && g.ByCriticality[l] > 0 {
		cpu = g.ByCriticality[l]
	}
	return cpu
}

// Leased is a task's Limits when a quota service hands them out: the
// last Lease received, valid until it expires, then the lease's fallback
// (SRE book ch. 21 footnote: Doorman). Before any lease arrives it uses a
// bootstrap Policy's fallback if one was given, otherwise no limit: a task
// never fails closed for want of a lease.
//
// Whatever the fallback, CRITICAL_PLUS without a valid lease is held only
// to the safe share (the limit divided by the tasks), never to zero: the
// traffic of in-quota customers that matters most is not refused for lack
// of a lease.
//
// Limit does one atomic load and one map lookup. Memory: the last lease.
type Leased struct {
	since func() time.Duration
	cur   atomic.Pointer[leaseState]
	boot  *Policy
}

type leaseState struct {
	lease   Lease
	grants  map[string]Grant
	expires int64 // ns on since's scale
	got     int64
}

// NewLeased returns a Leased on clk (nil: the real clock), with an
// optional bootstrap policy (nil: none).
func NewLeased(clk clock.Clock, bootstrap *Policy) *Leased {
	clk = clock.OrReal(clk)
	return &Leased{since: clock.SinceFunc(clk, clk.Now()), boot: bootstrap}
}

// Set installs a lease received now. A lease that is not valid (see
// Lease.Validate) is refused and the last one stays.
func (l *Leased) Set(ls Lease) error {
	if err := ls.Validate(); err != nil {
		return err
	}
	now := int64(l.since())
	st := &leaseState{lease: ls, grants: make(map[string]Grant, len(ls.Grants)), expires: now + int64(ls.Duration), got: now}
	for _, g := range ls.Grants {
		st.grants[g.Customer] = g
	}
	l.cur.Store(st)
	return nil
}

// Validate checks a lease as received from the wire.
func (ls Lease) Validate() error {
	if ls.Duration <= 0 || ls.Duration > 24*time.Hour || ls.Refresh <= 0 || ls.Refresh > ls.Duration {
		return errors.New("quota: lease duration or refresh out of range")
	}
	if ls.Tasks < 1 || ls.Tasks > MaxCustomers {
		return errors.New("quota: lease tasks out of range")
	}
	switch ls.Fallback {
	case Safe, Optimistic, Pessimistic:
	default:
		return errors.New("quota: lease fallback unknown")
	}
	if len(ls.Grants) > MaxCustomers+1 {
		return errors.New("quota: lease has too many grants")
	}
	check := func(g Grant) error {
		if validLimit(g.CPU) != nil || math.IsNaN(g.Share) || g.Share < 0 || g.Share > 1 {
			return errors.New("quota: lease grant out of range")
		}
		for _, v := range g.ByCriticality {
			if validLimit(v) != nil {
				return errors.New("quota: lease grant out of range")
			}
		}
		return nil
	}
	if err := check(ls.Default); err != nil {
		return err
	}
	for _, g := range ls.Grants {
		if g.Customer != Other && validName(g.Customer) != nil {
			return errors.New("quota: lease names an invalid customer")
		}
		if err := check(g); err != nil {
			return err
		}
	}
	return nil
}

// Limit implements Limits.
func (l *Leased) Limit(customer string, lv criticality.Level) (float64, bool) {
	st := l.cur.Load()
	if st == nil {
		if l.boot == nil {
			return math.Inf(1), false
		}
		_, hard := l.boot.Limit(customer, lv)
		return fallback(l.boot.fallback, l.boot.fallbackLimit(customer, lv), safeOf(l.boot, customer, lv), lv), hard
	}
	g, ok := st.grants[customer]
	if !ok {
		g = st.lease.Default
		if st.lease.Partial && l.boot != nil && l.boot.Known(customer) {
			g = l.boot.Grant(customer, g.Share)
		}
	}
	lim := g.limit(lv)
	if int64(l.since()) < st.expires {
		return lim * g.Share, g.Hard
	}
	safe := lim / float64(st.lease.Tasks)
	return fallback(st.lease.Fallback, safe, safe, lv), g.Hard
}

func safeOf(p *Policy, customer string, lv criticality.Level) float64 {
	cpu, _ := p.Limit(customer, lv)
	return cpu / float64(p.tasks)
}

// fallback returns what an expired (or missing) lease enforces: mode's
// limit, except that CRITICAL_PLUS is held to no less than the safe share.
func fallback(mode Fallback, v, safe float64, lv criticality.Level) float64 {
	switch mode {
	case Optimistic:
		return math.Inf(1)
	case Pessimistic:
		if lv == criticality.CriticalPlus {
			return safe
		}
		return 0
	}
	return v
}

// Share returns the share of customer's limit held under a valid lease,
// or 0.
func (l *Leased) Share(customer string) float64 {
	st := l.cur.Load()
	if st == nil || int64(l.since()) >= st.expires {
		return 0
	}
	g, ok := st.grants[customer]
	if !ok {
		g = st.lease.Default
	}
	return g.Share
}

// Expired reports whether there is no valid lease (none yet, or run out).
func (l *Leased) Expired() bool {
	st := l.cur.Load()
	return st == nil || int64(l.since()) >= st.expires
}

// Age returns the time since the last lease was received, and false if
// none ever was.
func (l *Leased) Age() (time.Duration, bool) {
	st := l.cur.Load()
	if st == nil {
		return 0, false
	}
	return time.Duration(int64(l.since()) - st.got), true
}

// Current returns the last lease received, if any.
func (l *Leased) Current() (Lease, bool) {
	st := l.cur.Load()
	if st == nil {
		return Lease{}, false
	}
	return st.lease, true
}
