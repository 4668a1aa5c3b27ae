// Package usage measures one task's CPU usage per customer and
// criticality over a sliding window (SRE book ch. 21, "Per-Customer
// Limits": quotas are in CPU, not requests): what each customer's requests
// cost, what quota's Enforcer compares with the customer's limits, and
// what the task reports to the quota service (Snapshot).
//
// Create a Table with New; the zero value is not usable. A Table is safe
// for concurrent use and bounded by WithMaxTracked, not by the customers
// callers name. Record each served request with Add (or through
// quota.Enforcer.Done) and each refused one with Refused.
package usage

import (
	"errors"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/window"
)

// Other is the name under which a Table counts customers beyond its
// bound, and requests that name no customer; quota's Enforcer holds them
// to Other's limit.
const Other = "(other)"

// Accounted is the name customer's requests are accounted under: a
// request that names no customer (every untrusted caller's, by default)
// counts under Other, so that it is measured and reported, under a name
// the quota service accepts.
func Accounted(customer string) string {
	if customer == "" {
		return Other
	}
	return customer
}

// maxTracked bounds WithMaxTracked: as many customers as a quota policy
// may name.
const maxTracked = 100000

// Table is one task's CPU usage per customer and criticality over a
// sliding window (default 4 s of 20 buckets: long enough that a customer
// sending 50 requests a second is measured within a few percent, short
// enough for enforcement to converge within seconds), in CPU-seconds per
// second: what each
// customer's requests cost (package cost), what the Enforcer compares with
// the limits and what the task reports to the quota service. It also
// counts each customer's served and refused requests, so that a customer's
// demand (what it would use if nothing were refused) can be estimated,
// and the whole task's usage.
//
// Bounded: at most MaxTracked customers (default 10,000) are tracked by
// name; the usage of any further customer is counted under Other until a
// tracked customer has been idle for a whole window and is dropped (the
// map then holds at most MaxTracked+1 entries, each of fixed size). Add
// takes a read lock, three atomic adds and the customer's own lock for a
// known customer, and for an untracked one while the map is full; the map
// is swept for idle customers at most once a bucket, so a flood of new
// names costs O(1) per request.
type Table struct {
	since  func() time.Duration
	clock  clock.Clock // since's: an Enforcer over this Table reads it
	width  int64
	n      int
	tau    float64 // ns, the time constant of the recent usage
	max    int
	all    *window.Counter // A: CPU µs of every customer
	mu     sync.RWMutex
	byName map[string]*usageOf
	// sweepAt is when the tracked customers may next be swept for idle
	// ones while the map is full (at most once a bucket), ns.
	sweepAt atomic.Int64
	scanned int // entries visited by sweeps (tests)
}

type usageOf struct {
	// lo counts CPU microseconds of SHEDDABLE (A) and SHEDDABLE_PLUS (B),
	// hi of CRITICAL (A) and CRITICAL_PLUS (B).
	lo, hi *window.Counter
	// reqs counts served (A) and refused (B) requests.
	reqs    *window.Counter
	refused atomic.Uint64 // refused requests, ever
	last    atomic.Int64  // when it was last added to, ns (within a bucket)

	// recent is the usage per level decayed exponentially (time constant
	// tau), as of at: what enforcement reads (see From).
	mu     sync.Mutex
	recent [criticality.NumLevels]float64
	at     int64
}

// Option configures a Table.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	window time.Duration
	max    int
	clock  clock.Clock
}

// withWindow sets the sliding window. Default 4 s.
func withWindow(d time.Duration) Option {
	return optionFunc(func(c *config) { c.window = d })
}

// WithClock sets the Table's clock, which an Enforcer over it reads
// too. Default clock.Real().
func WithClock(c clock.Clock) Option { return optionFunc(func(cfg *config) { cfg.clock = c }) }

// WithMaxTracked bounds the customers tracked by name, at most 100,000.
// Default 10,000.
func WithMaxTracked(n int) Option { return optionFunc(func(c *config) { c.max = n }) }

// New returns a Table.
func New(opts ...Option) (*Table, error) {
	c := config{window: 4 * time.Second, max: 10000}
	for _, o := range opts {
		o.apply(&c)
	}
	if c.window < 20*time.Millisecond || c.max < 1 || c.max > maxTracked {
		return nil, errors.New("usage: window under 20ms or tracked customers out of range")
	}
	clk := clock.OrReal(c.clock)
	width := int64(c.window / 20)
	return &Table{
		clock: clk, since: clock.SinceFunc(clk, clk.Now()), width: width, n: 20, max: c.max, tau: float64(c.window / 2),
		all: window.New(width, 20, 1), byName: map[string]*usageOf{},
	}, nil
}

// Clock returns the Table's clock (WithClock).
func (u *Table) Clock() clock.Clock { return u.clock }

// MaxTracked returns how many customers the Table tracks by name
// (WithMaxTracked).
func (u *Table) MaxTracked() int { return u.max }

// Window returns the sliding window.
func (u *Table) Window() time.Duration { return time.Duration(u.width * int64(u.n)) }

// Add counts one served request of customer at level l that cost cpu.
func (u *Table) Add(customer string, l criticality.Level, cpu time.Duration) {
	if !l.Valid() {
		l = criticality.Default
	}
	now := int64(u.since())
	uo := u.get(customer, now)
	uo.reqs.Add(now, 1, 0)
	if cpu <= 0 {
		return
	}
	us := uint32(min(cpu.Microseconds(), 1<<32-1))
	c, second := uo.counter(l)
	if second {
		c.Add(now, 0, us)
	} else {
		c.Add(now, us, 0)
	}
	u.all.Add(now, us, 0)
	uo.mu.Lock()
	uo.decay(now, u.tau)
	uo.recent[l] += float64(cpu) / u.tau
	uo.mu.Unlock()
}

// decay brings the recent usage to now. Callers hold uo.mu.
func (uo *usageOf) decay(now int64, tau float64) {
	if now <= uo.at {
		return
	}
	f := math.Exp(-float64(now-uo.at) / tau)
	for i := range uo.recent {
		uo.recent[i] *= f
	}
	uo.at = now
}

// Refused counts one refused request of customer.
func (u *Table) Refused(customer string) {
	now := int64(u.since())
	uo := u.get(customer, now)
	uo.reqs.Add(now, 0, 1)
	uo.refused.Add(1)
}

// counter returns the counter of level l and whether l is its second kind.
func (uo *usageOf) counter(l criticality.Level) (*window.Counter, bool) {
	c := uo.lo
	if l >= criticality.Critical {
		c = uo.hi
	}
	return c, l == criticality.SheddablePlus || l == criticality.CriticalPlus
}

func (u *Table) get(customer string, now int64) *usageOf {
	customer = Accounted(customer)
	u.mu.RLock()
	uo := u.byName[customer]
	if uo == nil && len(u.byName) >= u.max && now < u.sweepAt.Load() {
		uo = u.byName[Other] // full, and swept within the bucket
	}
	u.mu.RUnlock()
	if uo == nil {
		uo = u.add(customer, now)
	}
	if now-uo.last.Load() > u.width { // refreshed at most once a bucket
		uo.last.Store(now)
	}
	return uo
}

// add tracks customer, or counts it under Other when MaxTracked customers
// are tracked and none has been idle for a window.
func (u *Table) add(customer string, now int64) *usageOf {
	u.mu.Lock()
	defer u.mu.Unlock()
	if uo := u.byName[customer]; uo != nil {
		return uo
	}
	if len(u.byName) >= u.max && now >= u.sweepAt.Load() {
		u.sweepAt.Store(now + u.width)
		for name, uo := range u.byName { // drop the idle
			u.scanned++
			if now-uo.last.Load() > u.width*int64(u.n) {
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
	uo := &usageOf{lo: window.New(u.width, u.n, 1), hi: window.New(u.width, u.n, 1), reqs: window.New(u.width, u.n, 1)}
	uo.last.Store(now)
	u.byName[customer] = uo
	return uo
}

func (u *Table) lookup(customer string) *usageOf {
	customer = Accounted(customer)
	u.mu.RLock()
	uo := u.byName[customer]
	u.mu.RUnlock()
	return uo
}

// perSecond converts a window's sum of microseconds at now to CPU-seconds
// per second: over the window, or over the part of it the Table has
// existed (at least one bucket), so that a task just started does not
// report a quarter of its rate for its first seconds.
func (u *Table) perSecond(us float64, now int64) float64 {
	span := min(u.width*int64(u.n), max(now, u.width))
	return us / 1e6 / time.Duration(span).Seconds()
}

// levels returns uo's usage per level, in CPU-seconds per second.
func (u *Table) levels(uo *usageOf, now int64) (r [criticality.NumLevels]float64) {
	lo, _ := uo.lo.Sums(now)
	hi, _ := uo.hi.Sums(now)
	r[criticality.Sheddable] = u.perSecond(lo.A, now)
	r[criticality.SheddablePlus] = u.perSecond(lo.B, now)
	r[criticality.Critical] = u.perSecond(hi.A, now)
	r[criticality.CriticalPlus] = u.perSecond(hi.B, now)
	return r
}

// Rate returns customer's usage at level l in CPU-seconds per second over
// the window.
func (u *Table) Rate(customer string, l criticality.Level) float64 {
	uo := u.lookup(customer)
	if uo == nil || !l.Valid() {
		return 0
	}
	return u.levels(uo, int64(u.since()))[l]
}

// From returns customer's recent usage at level l and every level above
// it, in CPU-seconds per second: what a request at l is measured by, since
// the higher levels have the first claim on the customer's quota.
//
// Recent usage decays exponentially with a time constant of half the
// window, rather than sliding: used as the feedback of enforcement, a
// sliding window echoes every burst of admissions one window later (the
// burst leaves the window at once, the customer is let in again at once),
// and the served rate oscillates instead of settling at the limit.
func (u *Table) From(customer string, l criticality.Level) float64 {
	uo := u.lookup(customer)
	if uo == nil || !l.Valid() {
		return 0
	}
	now := int64(u.since())
	var t float64
	uo.mu.Lock()
	uo.decay(now, u.tau)
	for k := l; k < criticality.NumLevels; k++ {
		t += uo.recent[k]
	}
	uo.mu.Unlock()
	return t
}

// WindowFrom is From over the sliding window: the CPU customer's requests
// at level l and above used in the last window, divided by the window.
// Hard limits are held against it, so that over any window a customer
// uses at most its limit times the window (plus what is in flight when it
// gets there).
func (u *Table) WindowFrom(customer string, l criticality.Level) float64 {
	uo := u.lookup(customer)
	if uo == nil || !l.Valid() {
		return 0
	}
	r := u.levels(uo, int64(u.since()))
	var t float64
	for k := l; k < criticality.NumLevels; k++ {
		t += r[k]
	}
	return t
}

// Total returns customer's usage over all levels over the window.
func (u *Table) Total(customer string) float64 {
	var t float64
	for _, l := range criticality.All() {
		t += u.Rate(customer, l)
	}
	return t
}

// All returns the whole task's usage, every customer together.
func (u *Table) All() float64 {
	now := int64(u.since())
	w, _ := u.all.Sums(now)
	return u.perSecond(w.A, now)
}

// Tracked returns how many customers are tracked by name.
func (u *Table) Tracked() int {
	u.mu.RLock()
	defer u.mu.RUnlock()
	return len(u.byName)
}

// Customer is one customer's line in a Snapshot.
type Customer struct {
	Customer string
	// Used is the usage per level (indexed by criticality.Level), in
	// CPU-seconds per second.
	Used [criticality.NumLevels]float64
	// Demand estimates what the customer would use if nothing were
	// refused: its usage plus its refused requests at its mean cost per
	// served request. This is what the quota service splits limits by.
	Demand float64
	// Refused counts the customer's refused requests since it was first
	// tracked (a counter, for metrics).
	Refused uint64
	// Share is the share of the customer's limit the task holds under a
	// valid lease, 0 if none (filled in by the quota client): a restarted
	// quota service hands it back while it relearns the demand.
	Share float64
}

// Snapshot returns every tracked customer's usage, sorted by name (at
// most MaxTracked+1 lines), skipping customers idle for a whole window.
func (u *Table) Snapshot() []Customer {
	now := int64(u.since())
	u.mu.RLock()
	out := make([]Customer, 0, len(u.byName))
	for name, uo := range u.byName {
		if now-uo.last.Load() > u.width*int64(u.n) {
			continue
		}
		cu := Customer{Customer: name, Used: u.levels(uo, now), Refused: uo.refused.Load()}
		var used float64
		for _, v := range cu.Used {
			used += v
		}
		cu.Demand = used
		if r, _ := uo.reqs.Sums(now); r.A > 0 {
			cu.Demand += used / r.A * r.B
		} else if r.B > 0 {
			cu.Demand += u.perSecond(r.B*1000, now) // none served: guess 1 ms each
		}
		out = append(out, cu)
	}
	u.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Customer < out[j].Customer })
	return out
}
