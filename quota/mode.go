package quota

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/quota/usage"
)

// Mode is how limits are throttled: the CRE post's "Optimistic and
// pessimistic throttling".
type Mode uint8

const (
	// ModeOptimistic (the default) sheds only once usage has reached the
	// limit: the Enforcer compares measured usage with the limit, so when
	// demand jumps, global usage spikes over the maximum for as long as the
	// measurement takes to catch up (about a usage window), then converges.
	// Cheap, and what the post recommends for most systems.
	ModeOptimistic Mode = iota
	// ModePessimistic never lets global usage exceed the global maximum,
	// not even briefly. Each task holds a budget per customer that fills at
	// its leased rate (its share of the limit, less DefaultHeadroom) and
	// caps at DefaultBurst of it; a request is admitted only while the
	// budget is not in debt, and takes the customer's expected cost (the
	// mean CPU of its recent requests) from it up front; Done settles the
	// difference. The quota service (an Allocator in ModePessimistic) hands
	// out shares that sum to at most 1, and raises a task's share only from
	// what the other tasks have confirmed they no longer hold. The costs:
	// every limit is held as hard (no work conservation), capacity goes
	// unused (the headroom, the burst's cap, shares waiting for
	// confirmation, demand landing where the share is not yet), and every
	// request takes a lock on its customer's budget.
	ModePessimistic
)

// String returns "optimistic" or "pessimistic".
func (m Mode) String() string {
	switch m {
	case ModeOptimistic:
		return "optimistic"
	case ModePessimistic:
		return "pessimistic"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// ParseMode parses "optimistic" or "pessimistic".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "optimistic":
		return ModeOptimistic, nil
	case "pessimistic":
		return ModePessimistic, nil
	}
	return 0, fmt.Errorf("quota: unknown throttling mode %q (want optimistic or pessimistic)", s)
}

// Pessimistic mode's defaults.
const (
	// DefaultHeadroom is the part of a task's share a pessimistic budget
	// leaves unused, so that the burst and a request's overrun past its
	// expected cost stay within the limit in any 1 s window: a budget
	// filling at (1-h)·r with a burst cap of b·(1-h)·r admits at most
	// (1-h)(1+b)·r = 0.945·r per second.
	DefaultHeadroom = 0.10
	// DefaultBurst is a budget's cap in seconds of its rate.
	DefaultBurst = 50 * time.Millisecond
	// initialCost is the expected cost of a customer's request before one
	// has been measured.
	initialCost = time.Millisecond
)

// WithMode sets the throttling mode. Default ModeOptimistic.
func WithMode(m Mode) EnforcerOption {
	return enforcerOptionFunc(func(c *enforcerConfig) { c.mode = m })
}

// WithHeadroom sets the part of each share a pessimistic budget leaves
// unused, in [0, 0.9]. Default DefaultHeadroom.
func WithHeadroom(h float64) EnforcerOption {
	return enforcerOptionFunc(func(c *enforcerConfig) { c.headroom = h })
}

// budgets are a pessimistic Enforcer's per-customer budgets. Bounded like
// the usage Table: at most its MaxTracked customers by name, every further one
// in the Other budget; while full, budgets idle for budgetIdle are dropped
// (at most once a second), so that new customers get budgets of their own
// again. A dropped budget held at most one request's debt, repaid long
// before at any rate that matters.
type budgets struct {
	mu       sync.Mutex
	max      int
	headroom float64
	burst    float64 // seconds
	byName   map[string]*budget
	sweepAt  int64 // ns
}

// budgetIdle is how long a budget goes unused before it may be dropped.
const budgetIdle = 10 * time.Second

type budget struct {
	tokens float64 // CPU-seconds; negative is debt
	at     int64   // when last filled, ns
	cost   float64 // expected CPU-seconds per request (EWMA)
}

func (b *budgets) get(customer string, now int64) *budget {
	bg := b.byName[customer]
	if bg == nil {
		if len(b.byName) >= b.max && now >= b.sweepAt {
			b.sweepAt = now + int64(time.Second)
			for name, old := range b.byName {
				if now-old.at > int64(budgetIdle) {
					delete(b.byName, name)
				}
			}
		}
		if len(b.byName) >= b.max {
			customer = Other
			if bg = b.byName[Other]; bg != nil {
				return bg
			}
		}
		bg = &budget{at: now, cost: initialCost.Seconds()}
		b.byName[customer] = bg
	}
	return bg
}

// reserve fills the customer's budget at rate (CPU-seconds per second) and
// takes the expected cost if the budget is not in debt. It returns the
// amount reserved, or false.
func (b *budgets) reserve(customer string, rate float64, now int64) (float64, bool) {
	rate *= 1 - b.headroom
	b.mu.Lock()
	defer b.mu.Unlock()
	bg := b.get(customer, now)
	bg.tokens = min(bg.tokens+rate*float64(now-bg.at)/1e9, rate*b.burst)
	bg.at = now
	if bg.tokens < 0 || rate <= 0 {
		return 0, false
	}
	bg.tokens -= bg.cost
	return bg.cost, true
}

// settle charges what a request really cost against what it reserved.
func (b *budgets) settle(customer string, reserved, cost float64) {
	b.mu.Lock()
	bg := b.byName[customer]
	if bg == nil {
		bg = b.byName[Other]
	}
	if bg != nil {
		bg.tokens -= cost - reserved
		bg.cost += 0.1 * (cost - bg.cost)
	}
	b.mu.Unlock()
}

// Reservation is what a request took from its customer's pessimistic
// budget when it was admitted (zero in ModeOptimistic). Pass it to Done.
type Reservation struct{ cpu float64 }

// reservePessimistic is Reserve in ModePessimistic: this task's share of
// the customer's overall limit is held as hard, ahead of the usage; a
// lower limit of level l, if the policy has one, is also held, by
// measurement.
func (e *Enforcer) reservePessimistic(customer string, l criticality.Level, limit float64) (Reservation, error) {
	overall, _ := e.limits.Limit(customer, criticality.CriticalPlus)
	if limit < overall && e.usage.WindowFrom(customer, l) >= limit {
		return Reservation{}, e.refuse(customer, l)
	}
	if math.IsInf(overall, 1) {
		return Reservation{}, nil
	}
	cpu, ok := e.budgets.reserve(customer, overall, int64(e.since()))
	if !ok {
		return Reservation{}, e.refuse(customer, l)
	}
	return Reservation{cpu: cpu}, nil
}

// Done records what an admitted request of customer at level l cost: it
// adds it to the usage Table and, in ModePessimistic, settles the customer's
// budget against r, what the request reserved (from Reserve; a zero
// Reservation, as from Admit, charges the whole cost). Call it once per
// admitted request, instead of the Table's Add.
func (e *Enforcer) Done(customer string, l criticality.Level, r Reservation, cpu time.Duration) {
	customer = usage.Accounted(customer)
	e.usage.Add(customer, l, cpu)
	if e.budgets != nil {
		e.budgets.settle(customer, r.cpu, cpu.Seconds())
	}
}

// Cancel gives back what a request admitted by Reserve reserved, when it
// will not run after all (a later stage refused it).
func (e *Enforcer) Cancel(customer string, r Reservation) {
	customer = usage.Accounted(customer)
	if e.budgets != nil && r.cpu > 0 {
		e.budgets.mu.Lock()
		bg := e.budgets.byName[customer]
		if bg == nil {
			bg = e.budgets.byName[Other]
		}
		if bg != nil {
			bg.tokens += r.cpu
		}
		e.budgets.mu.Unlock()
	}
}

// Mode returns the Enforcer's throttling mode.
func (e *Enforcer) Mode() Mode {
	if e.budgets != nil {
		return ModePessimistic
	}
	return ModeOptimistic
}
