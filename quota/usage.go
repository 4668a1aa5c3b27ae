package quota

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/window"
)

// Other is the name under which Usage counts customers beyond its bound.
const Other = "(other)"

// Usage is one task's CPU usage per customer and criticality over a
// sliding window (default 10 s of 20 buckets), in CPU-seconds per second:
// what each customer's requests cost (package cost) and what the task
// reports to the quota service.
//
// Bounded: at most MaxTracked customers (default 10,000) are tracked by
// name; the usage of any further customer is counted under Other until a
// tracked customer has been idle for a whole window and is dropped (the
// map then holds at most MaxTracked+1 entries). Add takes a read lock and
// one atomic add for a known customer.
type Usage struct {
	since  func() time.Duration
	width  int64
	n      int
	max    int
	mu     sync.RWMutex
	byName map[string]*usageOf
}

type usageOf struct {
	// lo counts CPU microseconds of SHEDDABLE (A) and SHEDDABLE_PLUS (B),
	// hi of CRITICAL (A) and CRITICAL_PLUS (B).
	lo, hi *window.Counter
	last   atomic.Int64 // when it was last added to, ns (within a bucket)
}

// UsageOption configures a Usage.
type UsageOption func(*usageConfig)

type usageConfig struct {
	window time.Duration
	max    int
	clock  clock.Clock
}

// WithUsageWindow sets the sliding window. Default 10 s.
func WithUsageWindow(d time.Duration) UsageOption { return func(c *usageConfig) { c.window = d } }

// WithMaxTracked bounds the customers tracked by name. Default 10,000.
func WithMaxTracked(n int) UsageOption { return func(c *usageConfig) { c.max = n } }

// WithUsageClock sets the clock. Default clock.Real().
func WithUsageClock(c clock.Clock) UsageOption { return func(cfg *usageConfig) { cfg.clock = c } }

// NewUsage returns a Usage.
func NewUsage(opts ...UsageOption) (*Usage, error) {
	c := usageConfig{window: 10 * time.Second, max: 10000}
	for _, o := range opts {
		o(&c)
	}
	if c.window < 20*time.Millisecond || c.max < 1 || c.max > MaxCustomers {
		return nil, errors.New("quota: usage window under 20ms or tracked customers out of range")
	}
	clk := clock.OrReal(c.clock)
	return &Usage{
		since: clock.SinceFunc(clk, clk.Now()), width: int64(c.window / 20), n: 20, max: c.max,
		byName: map[string]*usageOf{},
	}, nil
}

// Add counts cpu spent by a request of customer at level l.
func (u *Usage) Add(customer string, l criticality.Level, cpu time.Duration) {
	if cpu <= 0 {
		return
	}
	if !l.Valid() {
		l = criticality.Default
	}
	now := u.since()
	uo := u.get(customer, now)
	us := uint32(min(cpu.Microseconds(), 1<<32-1))
	if c, second := uo.counter(l); second {
		c.Add(int64(now), 0, us)
	} else {
		c.Add(int64(now), us, 0)
	}
}

// counter returns the counter of level l and whether l is its second kind.
func (uo *usageOf) counter(l criticality.Level) (*window.Counter, bool) {
	c := uo.lo
	if l >= criticality.Critical {
		c = uo.hi
	}
	return c, l == criticality.SheddablePlus || l == criticality.CriticalPlus
}

func (u *Usage) get(customer string, now time.Duration) *usageOf {
	u.mu.RLock()
	uo := u.byName[customer]
	u.mu.RUnlock()
	if uo == nil {
		uo = u.add(customer, now)
	}
	if now-time.Duration(uo.last.Load()) > time.Duration(u.width) { // refreshed at most once a bucket
		uo.last.Store(int64(now))
	}
	return uo
}

// add tracks customer, or counts it under Other when MaxTracked customers
// are tracked and none has been idle for a window.
func (u *Usage) add(customer string, now time.Duration) *usageOf {
	u.mu.Lock()
	defer u.mu.Unlock()
	if uo := u.byName[customer]; uo != nil {
		return uo
	}
	if len(u.byName) >= u.max {
		for name, uo := range u.byName { // drop the idle
			if now-time.Duration(uo.last.Load()) > time.Duration(u.width*int64(u.n)) {
				delete(u.byName, name)
			}
		}
	}
	if len(u.byName) >= u.max {
		customer = Other // the map holds at most max+1 entries
		if uo := u.byName[Other]; uo != nil {
			return uo
		}
	}
	uo := &usageOf{lo: window.New(u.width, u.n, 1), hi: window.New(u.width, u.n, 1)}
	uo.last.Store(int64(now))
	u.byName[customer] = uo
	return uo
}

// Rate returns customer's usage at level l in CPU-seconds per second over
// the window.
func (u *Usage) Rate(customer string, l criticality.Level) float64 {
	u.mu.RLock()
	uo := u.byName[customer]
	u.mu.RUnlock()
	if uo == nil || !l.Valid() {
		return 0
	}
	c, second := uo.counter(l)
	w, _ := c.Sums(int64(u.since()))
	v := w.A
	if second {
		v = w.B
	}
	return v / 1e6 / (time.Duration(u.width * int64(u.n))).Seconds()
}

// Total returns customer's usage over all levels.
func (u *Usage) Total(customer string) float64 {
	var t float64
	for _, l := range criticality.All() {
		t += u.Rate(customer, l)
	}
	return t
}

// Tracked returns how many customers are tracked by name.
func (u *Usage) Tracked() int {
	u.mu.RLock()
	defer u.mu.RUnlock()
	return len(u.byName)
}
