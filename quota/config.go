// Package quota holds per-customer limits in CPU-seconds per second: SRE
// book ch. 21, "The Pitfalls of Queries per Second" ("a better solution is
// to measure capacity directly in available resources") and "Per-Customer
// Limits"; the CRE post's soft and hard quotas. The CPU-seconds are
// whatever the costs fed to a usage.Table are in: normalised CPU-seconds (the
// book's "virtual CPU": a core of the reference machine, whatever the
// machine type) when they come from a cost.Meter with cost.WithSpeed.
//
// This file is the policy: which customer may use how much, optionally per
// criticality, with a default for every other customer. A Policy is
// validated as a whole before it replaces the one in force, so a malformed
// or hostile push (blank or unknown names, NaN, negative or absurd limits)
// is refused with an error naming the problem and the last good policy
// stays (Google Cloud's June 2025 outage began with a bad policy push).
// Enforcement (Enforcer, over a usage.Table), leases (Leased) and the quota service's
// core (package quota/allocate) build on it.
package quota

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/quota/usage"
)

// Limits bound what a policy may say: at most MaxCustomers customers, each
// limit at most MaxLimit CPU-seconds per second, customer names at most
// MaxNameLen bytes of [A-Za-z0-9._:/@-].
const (
	MaxCustomers = 100000
	MaxLimit     = 1e6
	MaxNameLen   = 128
)

// Other is the name under which a task counts and limits the customers
// beyond its usage Table's bound and the requests that name no customer
// (usage.Other).
const Other = usage.Other

// Fallback is what a task enforces when its lease from the quota service
// has run out (the three modes of Doorman).
type Fallback string

const (
	// Safe enforces a static share of each limit: the limit divided by the
	// number of tasks the policy names. The default.
	Safe Fallback = "safe"
	// Optimistic enforces nothing (every customer may use the whole task).
	Optimistic Fallback = "optimistic"
	// Pessimistic enforces a limit of zero (Doorman: the client may use
	// no capacity). It fails closed, so it is never the default.
	Pessimistic Fallback = "pessimistic"
)

// Limit is one customer's quota.
type Limit struct {
	// CPU is the limit in CPU-seconds per second, over all criticalities.
	CPU float64 `yaml:"cpu" json:"cpu"`
	// ByCriticality optionally sets a lower limit for some criticalities,
	// keyed by level name (CRITICAL_PLUS, ...).
	ByCriticality map[string]float64 `yaml:"criticality,omitempty" json:"criticality,omitempty"`
	// Hard limits are never exceeded, even with spare capacity. Soft
	// (the default) limits are enforced only when the task is overloaded
	// (work conservation).
	Hard bool `yaml:"hard,omitempty" json:"hard,omitempty"`
}

// Config is a quota policy as written in a file:
//
//	default: {cpu: 0.5}             # every customer not listed
//	fallback: safe                   # safe (default), optimistic, pessimistic
//	tasks: 3                         # for the safe share; default 1
//	customers:
//	  search: {cpu: 4.0}
//	  ads: {cpu: 4.0, criticality: {SHEDDABLE: 1.0}}
//	  batch: {cpu: 0.5, hard: true}
type Config struct {
	Default   Limit            `yaml:"default" json:"default"`
	Fallback  Fallback         `yaml:"fallback,omitempty" json:"fallback,omitempty"`
	Tasks     int              `yaml:"tasks,omitempty" json:"tasks,omitempty"`
	Customers map[string]Limit `yaml:"customers,omitempty" json:"customers,omitempty"`
}

// Policy is a validated Config: safe to use from many goroutines, never
// modified.
type Policy struct {
	def       limit
	customers map[string]limit
	fallback  Fallback
	tasks     int
}

type limit struct {
	cpu   float64
	by    [criticality.NumLevels]float64 // 0: no separate limit
	hard  bool
	named bool
}

// New validates c and returns its Policy, or an error naming every
// problem found (up to ten).
func New(c Config) (*Policy, error) {
	var errs []string
	add := func(format string, args ...any) {
		if len(errs) < 10 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
	}
	p := &Policy{fallback: c.Fallback, tasks: c.Tasks, customers: make(map[string]limit, len(c.Customers))}
	switch c.Fallback {
	case "":
		p.fallback = Safe
	case Safe, Optimistic, Pessimistic:
	default:
		add("fallback %q is not safe, optimistic or pessimistic", c.Fallback)
	}
	switch {
	case c.Tasks == 0:
		p.tasks = 1
	case c.Tasks < 0 || c.Tasks > MaxCustomers:
		add("tasks %d out of range [1, %d]", c.Tasks, MaxCustomers)
	}
	if len(c.Customers) > MaxCustomers {
		add("%d customers, at most %d", len(c.Customers), MaxCustomers)
	}
	p.def = check("default", c.Default, add)
	names := make([]string, 0, len(c.Customers))
	for name := range c.Customers {
		names = append(names, name)
	}
	sort.Strings(names) // errors in a stable order
	for _, name := range names {
		if err := validName(name); err != nil {
			add("customer %q: %v", name, err)
			continue
		}
		l := check("customer "+name, c.Customers[name], add)
		l.named = true
		p.customers[name] = l
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("quota: invalid policy: %s", strings.Join(errs, "; "))
	}
	return p, nil
}

func check(what string, l Limit, add func(string, ...any)) limit {
	out := limit{cpu: l.CPU, hard: l.Hard}
	if err := validLimit(l.CPU); err != nil {
		add("%s: cpu %v", what, err)
	}
	for name, v := range l.ByCriticality {
		lv, err := criticality.Parse(name)
		if err != nil {
			add("%s: criticality %q is not a level", what, name)
			continue
		}
		if err := validLimit(v); err != nil {
			add("%s: criticality %s: %v", what, name, err)
			continue
		}
		if v > l.CPU {
			add("%s: criticality %s limit %v above the customer's %v", what, name, v, l.CPU)
			continue
		}
		out.by[lv] = v
	}
	return out
}

func validLimit(v float64) error {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return errors.New("is not a number")
	case v < 0:
		return errors.New("is negative")
	case v > MaxLimit:
		return fmt.Errorf("is above %g CPU-seconds per second", float64(MaxLimit))
	}
	return nil
}

// ValidName reports whether s may name a customer: 1 to MaxNameLen bytes
// of [A-Za-z0-9._:/@-], not blank. Adapters check names received on the
// wire with it.
func ValidName(s string) error { return validName(s) }

func validName(s string) error {
	if strings.TrimSpace(s) == "" {
		return errors.New("blank name")
	}
	if len(s) > MaxNameLen {
		return fmt.Errorf("name longer than %d bytes", MaxNameLen)
	}
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._:/@-", r)
		if !ok {
			return fmt.Errorf("character %q not allowed", r)
		}
	}
	return nil
}

// Limit returns the limit of customer at level l in CPU-seconds per
// second, and whether it is hard. Unknown customers get the default. A
// per-criticality limit, when set, is the smaller.
func (p *Policy) Limit(customer string, l criticality.Level) (cpu float64, hard bool) {
	lim, ok := p.customers[customer]
	if !ok {
		lim = p.def
	}
	cpu = lim.cpu
	if l.Valid() && lim.by[l] > 0 {
		cpu = lim.by[l]
	}
	return cpu, lim.hard
}

// Known reports whether the policy names customer (others get the
// default).
func (p *Policy) Known(customer string) bool {
	_, ok := p.customers[customer]
	return ok
}

// Fallback returns the mode for an expired lease.
func (p *Policy) Fallback() Fallback { return p.fallback }

// fallbackLimit returns what one task enforces for customer at level l
// once its lease has expired: its static share (the limit divided by the
// number of tasks) under Safe, no limit (+Inf) under Optimistic, zero under
// Pessimistic.
func (p *Policy) fallbackLimit(customer string, l criticality.Level) float64 {
	switch p.fallback {
	case Optimistic:
		return math.Inf(1)
	case Pessimistic:
		return 0
	}
	cpu, _ := p.Limit(customer, l)
	return cpu / float64(p.tasks)
}

// Grant returns customer's limits as a lease grants them, with share
// (the default's for a customer the policy does not name, whose grant
// then keeps customer's name; "" is the default's own).
func (p *Policy) Grant(customer string, share float64) Grant {
	l, ok := p.customers[customer]
	if !ok {
		l = p.def
	}
	return Grant{Customer: customer, CPU: l.cpu, ByCriticality: l.by, Hard: l.hard, Share: share}
}

// Tasks returns the number of tasks the policy's static shares divide
// each limit by (Config.Tasks, at least 1), and how many customers it
// names.
func (p *Policy) Tasks() (tasks, named int) { return p.tasks, len(p.customers) }

// Customers returns the named customers, sorted.
func (p *Policy) Customers() []string {
	out := make([]string, 0, len(p.customers))
	for n := range p.customers {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
