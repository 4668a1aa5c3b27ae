// Package allocate is the quota service's core, the Allocator: the
// global side of per-customer quotas (SRE book ch. 21, "Per-Customer
// Limits"; Doorman), which splits each customer's limit among the tasks
// that serve it from what they report. Package quota holds the policy it
// splits and the task's side (Enforcer, Leased); triagegrpc/quotaservice
// serves an Allocator over gRPC.
package allocate

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/quota/usage"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
)

// Allocator is the quota service's core (SRE book ch. 21 footnote:
// Doorman): tasks report each customer's usage and demand, and get back a
// quota.Lease with their share of every customer's global limit. A customer
// under its limit gives each task its demand and an even part of the
// room left. A customer at or over its limit is split in proportion to
// where its demand lands, and each task also gets a
// floor of a twentieth of the limit divided by the N live tasks, so that a
// task where a customer's demand appears has a share before its next
// report: the tasks with demand split the limit exactly (their floors
// included), and the tasks without hold at most 5% more between them,
// which they use only if demand arrives there. With no demand anywhere
// every task gets 1/N.
//
// Learning mode (after Doorman): for one lease after it starts (and, in
// quota.ModePessimistic, after a lease in which no task refreshed, when
// every grant it made has expired), the
// Allocator has not heard from every task, and splitting by the demand of
// the few it has heard from would hand them nearly whole limits. So it
// hands each task back the share it reports holding (or, without one, the
// safe share, 1/Tasks; in quota.ModePessimistic nothing, since the tasks not yet
// heard from may hold the whole limit) until the lease is over; a
// restarted quota service changes no limit. A claimed share is believed only up to what the
// task's reported demand justifies (a quarter more than demand/limit) and
// what the other tasks' claims leave (of 1, or 1.05 in quota.ModeOptimistic for
// the floors), never cut below the safe share; past learning, a task's
// claim counts (quota.ModePessimistic) only up to what this Allocator granted it.
// So a task that lies about its share takes no other task's room; one
// that lies about its demand gets what that demand would get.
//
// A task restarted under its name (its report says NoLease) gets, for its
// first lease, the demand its predecessor last reported where its own is
// smaller (quota.ModeOptimistic): its traffic is coming back to it, and a floor
// share would refuse its customers until its next report.
//
// A silence of every task for a lease (a tier frozen, the service cut
// off) forgets no task in quota.ModeOptimistic: a task's age counts only
// the time in which some task refreshed, and each task's first report
// after the silence gets, where larger, the demand it last reported (its
// usage window averaged over the silence), so the shares come back as
// they were. Meanwhile Tasks and Usage count no live task.
//
// Bounded: at most MaxTasks tasks (default 10,000; a task unheard of for a
// lease is forgotten at the next sweep, once a second, and a new task
// beyond the bound is refused with ErrTooManyTasks), each with at most quota.MaxReportCustomers customers, and
// at most MaxEntries customer entries over all of them (default
// DefaultMaxEntries).
// Refresh takes one lock; it is safe for concurrent use.
type Allocator struct {
	since    func() time.Duration
	lease    time.Duration
	refresh  time.Duration
	maxTasks int
	policy   atomic.Pointer[quota.Policy]
	// entries counts the customer entries of the live tasks' reports,
	// bounded by maxEntries.
	entries, maxEntries int

	mu    sync.Mutex
	tasks map[string]*taskState
	total map[string]float64 // demand per customer over live tasks
	// demanding counts, per customer, the live tasks reporting demand.
	demanding map[string]int
	used      map[string]*[criticality.NumLevels]float64
	swept     int64
	// accounted counts the customer entries account has added or taken
	// out (the work of a refresh; see TestRefreshWorkFollowsItsReport).
	accounted uint64
	served    atomic.Uint64
	mode      quota.Mode
	fresh     bool // WithFreshStart, or learning again after a lease without refreshes
	// learnFrom is when learning mode began (ns on since's scale): at the
	// start, or at the first refresh after a lease without any.
	learnFrom int64
	lastSeen  int64 // the latest refresh
	// holding sums, per customer, the shares the live tasks may hold
	// (quota.ModePessimistic only; see taskState.hold).
	holding map[string]float64
	// learned sums, per customer, the shares handed back in learning mode
	// (see taskState.learned); nil once learning is over.
	learned map[string]float64
}

type taskState struct {
	last     int64
	customer []usage.Customer
	// hold is, per customer, the share the task may be enforcing now: the
	// larger of the share last granted and the share it last reported,
	// believed only up to the share last granted (quota.ModePessimistic only).
	hold    map[string]float64
	granted map[string]float64
	// learned is, per customer, the share handed back to the task in
	// learning mode.
	learned map[string]float64
	// resumed is set when every task fell silent for a lease and this one
	// has not reported since (quota.ModeOptimistic; see resume).
	resumed bool
}

// ErrTooManyTasks is returned by Refresh when MaxTasks live tasks are
// known and another one reports, or when a report would take the
// customer entries of all live tasks past the bound (WithMaxEntries).
var ErrTooManyTasks = errors.New("quota: too many tasks")

// New returns an Allocator for policy p.
func New(p *quota.Policy, opts ...Option) (*Allocator, error) {
	c := allocatorConfig{lease: 30 * time.Second, refresh: 5 * time.Second, maxTasks: 10000, maxEntries: DefaultMaxEntries}
	for _, o := range opts {
		o(&c)
	}
	if p == nil {
		return nil, errors.New("allocate: an Allocator needs a quota.Policy")
	}
	if c.refresh <= 0 || c.lease < c.refresh || c.lease > 24*time.Hour {
		return nil, errors.New("allocate: need 0 < refresh <= lease <= 24h")
	}
	if c.maxTasks < 1 || c.maxTasks > quota.MaxCustomers {
		return nil, errors.New("allocate: max tasks out of range")
	}
	if c.maxEntries < quota.MaxReportCustomers {
		return nil, fmt.Errorf("allocate: max entries below one report's %d", quota.MaxReportCustomers)
	}
	if c.mode > quota.ModePessimistic {
		return nil, fmt.Errorf("allocate: unknown throttling mode %d", c.mode)
	}
	clk := clock.OrReal(c.clock)
	a := &Allocator{
		since: clock.SinceFunc(clk, clk.Now()), lease: c.lease, refresh: c.refresh, maxTasks: c.maxTasks, maxEntries: c.maxEntries,
		mode: c.mode, fresh: c.fresh, holding: map[string]float64{},
		tasks: map[string]*taskState{}, total: map[string]float64{}, demanding: map[string]int{}, used: map[string]*[criticality.NumLevels]float64{},
	}
	a.policy.Store(p)
	return a, nil
}

// SetPolicy replaces the policy (a validated one). nil is ignored.
func (a *Allocator) SetPolicy(p *quota.Policy) {
	if p != nil {
		a.policy.Store(p)
	}
}

// quota.Policy returns the policy in force.
func (a *Allocator) Policy() *quota.Policy { return a.policy.Load() }

// Refreshes returns how many leases were handed out.
func (a *Allocator) Refreshes() uint64 { return a.served.Load() }

// Refresh records r and returns the task's lease.
func (a *Allocator) Refresh(r quota.Report) (quota.Lease, error) {
	if err := r.Validate(); err != nil {
		return quota.Lease{}, err
	}
	p := a.policy.Load()
	now := int64(a.since())
	a.mu.Lock()
	defer a.mu.Unlock()
	if gap := now - a.lastSeen; a.served.Load() > 0 && a.silent(now) {
		// No refresh for a whole lease: every grant this Allocator made
		// has expired.
		if a.mode == quota.ModePessimistic {
			// The tasks it knew are forgotten. Learn again, as at a fresh
			// start.
			a.sweep(now)
			a.learnFrom, a.fresh, a.learned = now, true, nil
		} else {
			a.resume(gap)
		}
	}
	a.lastSeen = now
	r = a.inherit(r, now)
	t, err := a.record(r, now)
	if err != nil {
		return quota.Lease{}, err
	}
	ls := a.leaseFor(p, r, a.shareFunc(p, t, r, now))
	a.served.Add(1)
	return ls, nil
}

// resume keeps the tasks known across a silence of every task of gap
// (quota.ModeOptimistic): a task's age counts only the time in which the
// Allocator heard from some task, and each task's first report after the
// silence inherits its last demand (see inherit). a.mu is held.
func (a *Allocator) resume(gap int64) {
	for _, t := range a.tasks {
		t.last += gap
		t.resumed = true
	}
}

// inherit returns r with, where larger, the demand its task's last report
// gave, when that report is less than a lease old and r is the task's
// first since it started (r.NoLease: a task restarted under its name,
// whose traffic is coming back to it) or since a silence of every task
// (its usage window averaged over the silence). Without it the task would
// get a floor share of every customer until its next report, and refuse
// its customers' requests meanwhile. quota.ModeOptimistic only: in
// quota.ModePessimistic the predecessor may still enforce its lease while it
// drains, and the two together would hold more than the limit. a.mu is
// held.
func (a *Allocator) inherit(r quota.Report, now int64) quota.Report {
	t := a.tasks[r.Task]
	if t == nil || !r.NoLease && !t.resumed || a.mode == quota.ModePessimistic || now-t.last >= int64(a.lease) || len(t.customer) == 0 {
		return r
	}
	cs := slices.Clone(r.Customers)
	at := make(map[string]int, len(cs))
	for i, c := range cs {
		at[c.Customer] = i
	}
	for _, old := range t.customer {
		if i, ok := at[old.Customer]; ok {
			cs[i].Demand = max(cs[i].Demand, old.Demand)
		} else if len(cs) < quota.MaxReportCustomers {
			cs = append(cs, usage.Customer{Customer: old.Customer, Demand: old.Demand})
		}
	}
	r.Customers = cs
	return r
}

// record takes r as its task's current report. a.mu is held.
func (a *Allocator) record(r quota.Report, now int64) (*taskState, error) {
	if now-a.swept >= int64(time.Second) {
		a.sweep(now)
	}
	t := a.tasks[r.Task]
	old := 0
	if t != nil {
		old = len(t.customer)
	}
	if a.entries-old+len(r.Customers) > a.maxEntries {
		return nil, ErrTooManyTasks
	}
	if t == nil {
		if len(a.tasks) >= a.maxTasks {
			return nil, ErrTooManyTasks
		}
		t = &taskState{}
		a.tasks[r.Task] = t
	}
	a.entries += len(r.Customers) - old
	if a.mode == quota.ModePessimistic {
		a.release(t)
	}
	a.account(t.customer, -1)
	t.customer = append(t.customer[:0], r.Customers...)
	t.last, t.resumed = now, false
	a.account(t.customer, +1)
	return t, nil
}

// shareFunc returns the share of each customer's limit task t gets:
// where the customer's demand lands, with a floor for every task; in
// learning mode (the first lease after a start) what the task holds, else
// the safe share; in pessimistic mode never more than the room the other
// tasks leave (recorded as held). a.mu is held.
func (a *Allocator) shareFunc(p *quota.Policy, t *taskState, r quota.Report, now int64) func(customer string) float64 {
	n := float64(len(a.tasks))
	mine := make(map[string]float64, len(r.Customers))
	held := make(map[string]float64, len(r.Customers))
	for _, c := range r.Customers {
		mine[c.Customer] = c.Demand
		held[c.Customer] = c.Share
	}
	learning := now-a.learnFrom < int64(a.lease)
	if learning && a.learned == nil {
		a.learned = map[string]float64{}
	} else if !learning {
		a.learned, t.learned = nil, nil
	}
	share := func(customer string) float64 {
		if learning {
			return a.learn(p, t, customer, held[customer], mine[customer])
		}
		d := a.total[customer]
		if d <= 1e-9 {
			return 1 / n
		}
		// Under its limit, a customer's unused room is split evenly: each
		// task gets its demand and 1/n of the room, so that a task whose
		// demand is not yet known (just restarted, or where traffic just
		// moved) can serve the customer until its next report.
		if l := p.Grant(customer, 0).CPU; l > 0 && !math.IsInf(l, 1) && d < l {
			return min(1, (mine[customer]+(l-d)/n)/l)
		}
		f := 0.05 * d / n
		if a.mode == quota.ModePessimistic { // every task's floor inside the limit
			return min(1, (mine[customer]+f)/(d+n*f))
		}
		return min(1, (mine[customer]+f)/(d+float64(a.demanding[customer])*f))
	}
	if a.mode != quota.ModePessimistic {
		return share
	}
	prev := t.granted
	t.granted = make(map[string]float64, len(prev))
	return func(customer string) float64 {
		room := max(0, 1-a.holding[customer])
		s := min(share(customer), room)
		// A share the task says it holds is believed up to what this
		// Allocator last granted it or, while learning, up to what learn
		// believed of it: no task can claim the others' room.
		claim := min(held[customer], prev[customer])
		if learning {
			claim = s
		}
		h := max(s, claim)
		t.hold[customer] = h
		a.holding[customer] += h
		t.granted[customer] = s
		return s
	}
}

// learnCap bounds the sum of the shares of one customer handed back in
// learning mode: 1 in quota.ModePessimistic; in quota.ModeOptimistic 1 plus the 5% of
// floors the tasks without demand may hold.
func (a *Allocator) learnCap() float64 {
	if a.mode == quota.ModePessimistic {
		return 1
	}
	return 1.05
}

// learn is a task's share of a customer in learning mode: the share it
// reports holding (or, without one, the safe share, 1/Tasks; 0 in
// quota.ModePessimistic), believed up to what its demand justifies (a quarter
// more than demand/limit) and what the other tasks have left of learnCap,
// and never cut below the safe share: a task that claims a whole limit takes at most what its
// demand could use and the others have not claimed. a.mu is held.
func (a *Allocator) learn(p *quota.Policy, t *taskState, customer string, held, demand float64) float64 {
	tasks, _ := p.Tasks()
	safe := 1 / float64(tasks)
	if a.mode == quota.ModePessimistic && !a.fresh {
		// Tasks that have not reported yet may still enforce a previous
		// Allocator's grants, up to the whole limit: only what a task holds
		// is handed back.
		safe = 0
	}
	if held <= 0 {
		return safe
	}
	if t.learned == nil {
		t.learned = map[string]float64{}
	}
	others := a.learned[customer] - t.learned[customer]
	justified := a.learnCap() - others
	if cpu := p.Grant(customer, 0).CPU; cpu > 0 && !math.IsInf(cpu, 1) {
		justified = min(justified, 1.25*demand/cpu)
	}
	h := min(held, max(safe, justified))
	a.learned[customer] = others + h
	t.learned[customer] = h
	return h
}

// LeaseNamedCustomers is how many customers a policy may name for every
// lease to carry all of them; past it, a lease carries only the customers
// its task reported (quota.Lease.Partial), so that its size follows the task's
// customers, not the policy's (at most quota.MaxReportCustomers grants, about
// 2 MB on the wire).
const LeaseNamedCustomers = 1000

// leaseFor builds the lease of a task that reported r: a grant for every
// customer it reported and, unless the policy names more than
// LeaseNamedCustomers, every customer of the policy.
func (a *Allocator) leaseFor(p *quota.Policy, r quota.Report, share func(string) float64) quota.Lease {
	tasks, named := p.Tasks()
	ls := quota.Lease{Duration: a.lease, Refresh: a.refresh, Fallback: p.Fallback(), Tasks: tasks,
		Default: p.Grant("", 1/float64(len(a.tasks)))}
	var names []string
	if named <= LeaseNamedCustomers {
		names = p.Customers()
	} else {
		ls.Partial = true
	}
	for _, c := range r.Customers {
		if ls.Partial || !p.Known(c.Customer) {
			names = append(names, c.Customer)
		}
	}
	sort.Strings(names)
	ls.Grants = make([]quota.Grant, 0, len(names))
	for _, name := range names {
		ls.Grants = append(ls.Grants, p.Grant(name, share(name)))
	}
	return ls
}

// release takes a task's holds out of the running sums (quota.ModePessimistic).
func (a *Allocator) release(t *taskState) {
	for c, h := range t.hold {
		if a.holding[c] -= h; a.holding[c] <= 1e-12 {
			delete(a.holding, c)
		}
	}
	if t.hold == nil {
		t.hold = map[string]float64{}
	}
	clear(t.hold)
}

// account adds (sign +1) or removes (-1) a task's customers from the
// totals.
func (a *Allocator) account(cs []usage.Customer, sign float64) {
	a.accounted += uint64(len(cs))
	for _, c := range cs {
		if c.Demand > 0 {
			a.demanding[c.Customer] += int(sign)
			if a.demanding[c.Customer] <= 0 {
				delete(a.demanding, c.Customer)
			}
		}
		d := a.total[c.Customer] + sign*c.Demand
		u := a.used[c.Customer]
		if u == nil {
			u = new([criticality.NumLevels]float64)
			a.used[c.Customer] = u
		}
		var sum float64
		for l, v := range c.Used {
			u[l] = max(0, u[l]+sign*v)
			sum += u[l]
		}
		if d <= 1e-9 && sum <= 1e-9 && sign < 0 {
			delete(a.total, c.Customer)
			delete(a.used, c.Customer)
			continue
		}
		a.total[c.Customer] = max(0, d)
	}
}

// sweep forgets the tasks unheard of for a lease, taking each one's
// report out of the totals: work in proportion to the tasks and the
// reports forgotten, not to every live report. a.mu is held.
func (a *Allocator) sweep(now int64) {
	a.swept = now
	if a.mode != quota.ModePessimistic {
		// A silence of every task ages no task (see resume).
		now = min(now, a.lastSeen)
	}
	for name, t := range a.tasks {
		if now-t.last <= int64(a.lease) {
			continue
		}
		a.entries -= len(t.customer)
		a.account(t.customer, -1)
		a.release(t)
		if a.learned != nil {
			for c, h := range t.learned {
				if a.learned[c] -= h; a.learned[c] <= 1e-12 {
					delete(a.learned, c)
				}
			}
		}
		delete(a.tasks, name)
	}
}

// GlobalUsage is one customer's usage over every live task.
type GlobalUsage struct {
	Customer string
	Used     [criticality.NumLevels]float64
	Demand   float64
	Limit    float64 // the policy's limit over all criticalities
}

// Usage returns every customer's usage over the live tasks, sorted by
// name.
func (a *Allocator) Usage() []GlobalUsage {
	p := a.policy.Load()
	now := int64(a.since())
	a.mu.Lock()
	a.sweep(now)
	if a.silent(now) {
		a.mu.Unlock()
		return nil
	}
	out := make([]GlobalUsage, 0, len(a.used))
	for name, u := range a.used {
		lim := p.Grant(name, 0).CPU
		out = append(out, GlobalUsage{Customer: name, Used: *u, Demand: a.total[name], Limit: lim})
	}
	a.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Customer < out[j].Customer })
	return out
}

// RefreshAges calls f with how long ago each live task last refreshed
// (for metrics; O(tasks) under the Allocator's lock).
func (a *Allocator) RefreshAges(f func(age time.Duration)) {
	now := int64(a.since())
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, t := range a.tasks {
		if age := now - t.last; age <= int64(a.lease) {
			f(time.Duration(age))
		}
	}
}

// Tasks returns how many live tasks are known.
func (a *Allocator) Tasks() int {
	now := int64(a.since())
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.silent(now) {
		return 0
	}
	return len(a.tasks)
}

// silent reports whether no task has refreshed for a lease: no grant is
// in force, and the tasks kept across the silence (see resume) are not
// live. a.mu is held.
func (a *Allocator) silent(now int64) bool {
	return now-a.lastSeen > int64(a.lease)
}
