package quota

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota/usage"
)

// Limits gives the limit a task enforces for a customer at a level, in
// CPU-seconds per second, and whether it is hard. A *Policy is the limits
// of a task that is the whole service; a *Leased holds the per-task limits
// leased from the quota service, with its fallback.
type Limits interface {
	Limit(customer string, l criticality.Level) (cpu float64, hard bool)
}

// Enforcer decides, per request, whether a customer is within its quota
// on this task: SRE book ch. 21, "Per-Customer Limits", and the CRE post's
// soft and hard quotas.
//
//   - A hard limit is never exceeded: a customer whose usage over the
//     last window (usage.Table.WindowFrom, default 4 s) has reached it is
//     refused whatever the load, so over any window it uses at most its
//     limit times the window, plus what it has in flight at that moment;
//     below that bound, its recent rate (usage.Table.From) is held at 98-99%
//     of the limit the way fairness holds soft limits (below), so the
//     served rate settles just under the limit instead of all-then-nothing
//     every window. This is optimistic throttling (ModeOptimistic): when
//     demand jumps, the customer overshoots until the measurement catches
//     up; ModePessimistic holds the limit ahead of the usage.
//   - A soft limit (the default) is enforced only while the task is
//     overloaded (work conservation): with spare capacity an over-quota
//     customer is served in full.
//   - Fairness: while overloaded, customers are refused in order of how
//     far over their quota they are. The Enforcer keeps a threshold τ on
//     the ratio usage/limit: at the first overloaded interval it starts at
//     4, then falls by 30% every interval (default 250 ms) the task is
//     still overloaded, never below 1; it rises by 25% every interval the
//     task is not, and is lifted altogether above 8. A request is refused
//     with a probability rising from 0 when its customer's ratio reaches
//     τ to 1 when it is 1% above (so an over-quota customer's admissions
//     thin out smoothly instead of all or nothing). So a customer within
//     its quota is never refused for quota (one exactly at it may be,
//     rarely, by measurement noise), and one far over it converges to
//     about 1% above its limit.
//   - Within a customer, higher criticality has the first claim on the
//     quota: a request of level l is measured by the usage of l and every
//     level above it (usage.Table.From), so a level is refused only once every
//     lower level of that customer is refused, and CRITICAL_PLUS of a
//     customer within quota never is.
//
// Usage comes from a usage.Table (what the task's requests of each
// customer cost), whose clock the Enforcer reads too; limits from a
// Limits (the Policy, or a Leased from the quota service). Overload comes
// from WithCapacity (the CPU the task is provisioned for, against the
// Table's All) or WithOverload (any signal, such as
// admission.Controller.Overloaded). Call Reserve before a request runs and
// Done after it (or Cancel). A refusal is outcome OutOfQuota with a
// RetryAfter of 1 s, and is counted in the Table (for the customer's
// demand) and per level (Refused).
//
// Reserve reads the clock once, looks the customer up once and takes no lock
// except, once per interval, to move τ. Memory is fixed.
type Enforcer struct {
	limits   Limits
	usage    *usage.Table
	since    func() time.Duration
	interval time.Duration
	capacity float64
	overload func() bool
	random   func() float64

	mu       sync.Mutex   // held while moving the threshold
	next     atomic.Int64 // when τ next moves, ns
	tau      atomic.Uint64
	overSeen atomic.Bool // an overloaded Reserve in this interval
	refused  [criticality.NumLevels]atomic.Uint64
	errOut   *outcome.Error
	budgets  *budgets // ModePessimistic only
}

// EnforcerOption configures an Enforcer.
type EnforcerOption interface{ applyEnforcer(*enforcerConfig) }

type enforcerOptionFunc func(*enforcerConfig)

func (f enforcerOptionFunc) applyEnforcer(c *enforcerConfig) { f(c) }

type enforcerConfig struct {
	interval time.Duration
	capacity float64
	overload func() bool
	random   func() float64
	mode     Mode
	headroom float64
}

// withAdjustInterval sets how often the fairness threshold moves. Default
// 250 ms.
func withAdjustInterval(d time.Duration) EnforcerOption {
	return enforcerOptionFunc(func(c *enforcerConfig) { c.interval = d })
}

// WithCapacity sets the CPU-seconds per second the task is provisioned
// for: the task counts as overloaded while its customers' usage
// (usage.Table.All) is at 95% of it or more. Combined with WithOverload, either
// one makes the task overloaded.
func WithCapacity(cpu float64) EnforcerOption {
	return enforcerOptionFunc(func(c *enforcerConfig) { c.capacity = cpu })
}

// WithOverload sets a signal of overload, such as
// admission.Controller.Overloaded (the task is shedding). Without it and
// without WithCapacity, the task never counts as overloaded and only hard
// limits are enforced.
func WithOverload(f func() bool) EnforcerOption {
	return enforcerOptionFunc(func(c *enforcerConfig) { c.overload = f })
}

// WithEnforcerRandom sets the source of the refusal draws, uniform in
// [0, 1) (for reproducible simulations). Default math/rand/v2.
func WithEnforcerRandom(f func() float64) EnforcerOption {
	return enforcerOptionFunc(func(c *enforcerConfig) { c.random = f })
}

// NewEnforcer returns an Enforcer over limits and usage u.
func NewEnforcer(limits Limits, u *usage.Table, opts ...EnforcerOption) (*Enforcer, error) {
	if limits == nil || u == nil {
		return nil, errors.New("quota: an Enforcer needs Limits and a usage Table")
	}
	c := enforcerConfig{interval: 250 * time.Millisecond, headroom: DefaultHeadroom}
	for _, o := range opts {
		o.applyEnforcer(&c)
	}
	if c.interval <= 0 {
		return nil, errors.New("quota: adjust interval must be positive")
	}
	if math.IsNaN(c.capacity) || c.capacity < 0 || c.capacity > MaxLimit {
		return nil, errors.New("quota: capacity must be a number in [0, 1e6]")
	}
	if c.mode > ModePessimistic {
		return nil, fmt.Errorf("quota: unknown throttling mode %d", c.mode)
	}
	if math.IsNaN(c.headroom) || c.headroom < 0 || c.headroom > 0.9 {
		return nil, errors.New("quota: headroom must be in [0, 0.9]")
	}
	if c.random == nil {
		c.random = rand.Float64
	}
	clk := u.Clock() // time is set once: on the Table
	e := &Enforcer{
		limits: limits, usage: u, since: clock.SinceFunc(clk, clk.Now()), interval: c.interval,
		capacity: c.capacity, overload: c.overload, random: c.random,
		errOut: &outcome.Error{Kind: outcome.OutOfQuota, Reason: "customer over quota", RetryAfter: time.Second},
	}
	if c.mode == ModePessimistic {
		e.budgets = &budgets{max: u.MaxTracked(), headroom: c.headroom, burst: DefaultBurst.Seconds(), byName: map[string]*budget{}}
	}
	e.tau.Store(math.Float64bits(math.Inf(1)))
	return e, nil
}

// Limits returns the limits in force.
func (e *Enforcer) Limits() Limits { return e.limits }

// Usage returns the usage Table the Enforcer reads.
func (e *Enforcer) Usage() *usage.Table { return e.usage }

// Threshold returns the fairness threshold τ (+Inf while the task has not
// been overloaded lately).
func (e *Enforcer) Threshold() float64 { return math.Float64frombits(e.tau.Load()) }

// Refused returns how many requests of level l were refused for quota.
func (e *Enforcer) Refused(l criticality.Level) uint64 {
	if !l.Valid() {
		return 0
	}
	return e.refused[l].Load()
}

// Overloaded reports whether the task counts as overloaded now.
func (e *Enforcer) Overloaded() bool {
	if e.capacity > 0 && e.usage.All() >= 0.95*e.capacity {
		return true
	}
	return e.overload != nil && e.overload()
}

// Reserve says whether a request of customer at level l may run now, and
// returns what it reserved from its customer's budget in ModePessimistic
// (zero otherwise). The error is nil or the shared out-of-quota error (do
// not modify it). Pass the Reservation to Done when the request is done,
// or to Cancel if it will not run after all.
func (e *Enforcer) Reserve(customer string, l criticality.Level) (Reservation, error) {
	if !l.Valid() {
		l = criticality.Default
	}
	customer = usage.Accounted(customer)
	limit, hard := e.limits.Limit(customer, l)
	if math.IsInf(limit, 1) {
		return Reservation{}, nil
	}
	if e.budgets != nil {
		return e.reservePessimistic(customer, l, limit)
	}
	return Reservation{}, e.admitOptimistic(customer, l, limit, hard)
}

func (e *Enforcer) admitOptimistic(customer string, l criticality.Level, limit float64, hard bool) error {
	overloaded := e.Overloaded()
	if overloaded {
		e.overSeen.Store(true)
	}
	if now := int64(e.since()); now >= e.next.Load() {
		e.adjust(now)
	}
	if !hard && !overloaded {
		return nil // work conservation
	}
	if hard {
		if limit <= 0 || e.usage.WindowFrom(customer, l) >= limit {
			return e.refuse(customer, l)
		}
		// Below the window's bound, the recent rate is held just under the
		// limit (98-99%), so that the served rate settles there instead
		// of all-then-nothing every window.
		over := (e.usage.From(customer, l)/(0.98*limit) - 1) / 0.01
		if over > 0 && (over >= 1 || e.random() < over) {
			return e.refuse(customer, l)
		}
		return nil
	}
	used := e.usage.From(customer, l)
	if limit <= 0 {
		return e.refuse(customer, l)
	}
	over := (used/(limit*e.Threshold()) - 1) / 0.01
	if over > 0 && (over >= 1 || e.random() < over) {
		return e.refuse(customer, l)
	}
	return nil
}

func (e *Enforcer) refuse(customer string, l criticality.Level) error {
	e.refused[l].Add(1)
	e.usage.Refused(customer)
	return e.errOut
}

// adjust moves τ once per interval: down while the task was overloaded,
// up otherwise.
func (e *Enforcer) adjust(now int64) {
	if !e.mu.TryLock() {
		return
	}
	defer e.mu.Unlock()
	if now < e.next.Load() {
		return
	}
	e.next.Store(now + int64(e.interval))
	tau := e.Threshold()
	if e.overSeen.Swap(false) {
		if math.IsInf(tau, 1) {
			tau = 4 / 0.7 // the first overloaded interval starts at 4
		}
		tau = max(1, tau*0.7)
	} else if !math.IsInf(tau, 1) {
		tau *= 1.25
		if tau > 8 {
			tau = math.Inf(1)
		}
	}
	e.tau.Store(math.Float64bits(tau))
}
