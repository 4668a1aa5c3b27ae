package triageotel

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/triagehq/triage/quota/allocate"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/connload"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/quota"
)

// instruments creates observable instruments and registers one callback
// over them, collecting the first error.
type instruments struct {
	m    metric.Meter
	errs []error
	all  []metric.Observable
}

func (in *instruments) gauge(name, unit, desc string) metric.Float64ObservableGauge {
	g, err := in.m.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
	in.errs, in.all = append(in.errs, err), append(in.all, g)
	return g
}

func (in *instruments) counter(name, unit, desc string) metric.Int64ObservableCounter {
	c, err := in.m.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	in.errs, in.all = append(in.errs, err), append(in.all, c)
	return c
}

func (in *instruments) register(f metric.Callback) (metric.Registration, error) {
	if err := errors.Join(in.errs...); err != nil {
		return nil, err
	}
	return in.m.RegisterCallback(f, in.all...)
}

func attrs(kv ...attribute.KeyValue) metric.ObserveOption { return metric.WithAttributes(kv...) }

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Quota registers a callback for one task's quota enforcement, read at
// each collection: triage.quota.usage_cpu and triage.quota.limit_cpu
// {customer, criticality} (CPU-seconds per second; limit +Inf when none
// applies), triage.quota.demand_cpu{customer},
// triage.quota.customer_refused{customer},
// triage.quota.refused{criticality}, triage.quota.threshold,
// triage.quota.overloaded, and with a lease l triage.quota.lease.age and
// triage.quota.lease.valid. Without WithCustomers, usage and demand are
// summed over the customers and the series of a customer's own (limit,
// customer_refused) are not reported. Customers are those e's Usage
// tracks.
func (m *Metrics) Quota(e *quota.Enforcer, l *quota.Leased) (metric.Registration, error) {
	in := &instruments{m: m.meter}
	usage := in.gauge("triage.quota.usage_cpu", "{cpu}", "A customer's CPU usage on this task, CPU-seconds per second, by criticality.")
	limit := in.gauge("triage.quota.limit_cpu", "{cpu}", "The limit this task enforces for a customer, CPU-seconds per second, by criticality (+Inf: none).")
	demand := in.gauge("triage.quota.demand_cpu", "{cpu}", "A customer's estimated demand on this task (usage plus refused requests at its mean cost), CPU-seconds per second.")
	crefused := in.counter("triage.quota.customer_refused", "{request}", "Requests of a customer refused out of quota on this task.")
	refused := in.counter("triage.quota.refused", "{request}", "Requests refused out of quota on this task, by criticality.")
	threshold := in.gauge("triage.quota.threshold", "", "The fairness threshold on usage/limit above which customers are refused while the task is overloaded (+Inf when it is not).")
	overloaded := in.gauge("triage.quota.overloaded", "", "1 while the task counts as overloaded, so soft limits apply.")
	age := in.gauge("triage.quota.lease.age", "s", "Time since the last lease from the quota service (absent before the first).")
	valid := in.gauge("triage.quota.lease.valid", "", "1 while the lease from the quota service is valid; 0 when the fallback applies.")
	return in.register(func(_ context.Context, ob metric.Observer) error {
		limits := e.Limits()
		var used [criticality.NumLevels]float64
		var all float64
		for _, c := range e.Usage().Snapshot() {
			if !m.customers {
				for lv, u := range c.Used {
					used[lv] += u
				}
				all += c.Demand
				continue
			}
			cust := keyCustomer.String(c.Customer)
			for _, lv := range criticality.All() {
				crit := keyCriticality.String(lv.String())
				ob.ObserveFloat64(usage, c.Used[lv], attrs(cust, crit))
				lim, _ := limits.Limit(c.Customer, lv)
				ob.ObserveFloat64(limit, lim, attrs(cust, crit))
			}
			ob.ObserveFloat64(demand, c.Demand, attrs(cust))
			ob.ObserveInt64(crefused, int64(c.Refused), attrs(cust))
		}
		if !m.customers {
			for _, lv := range criticality.All() {
				ob.ObserveFloat64(usage, used[lv], attrs(keyCriticality.String(lv.String())))
			}
			ob.ObserveFloat64(demand, all)
		}
		for _, lv := range criticality.All() {
			ob.ObserveInt64(refused, int64(e.Refused(lv)), attrs(keyCriticality.String(lv.String())))
		}
		ob.ObserveFloat64(threshold, e.Threshold())
		ob.ObserveFloat64(overloaded, b2f(e.Overloaded()))
		if l != nil {
			if a, ok := l.Age(); ok {
				ob.ObserveFloat64(age, a.Seconds())
			}
			ob.ObserveFloat64(valid, b2f(!l.Expired()))
		}
		return nil
	})
}

// QuotaService registers a callback for the quota service's view:
// triage.quota.global.usage_cpu{customer, criticality},
// triage.quota.global.demand_cpu{customer},
// triage.quota.global.limit_cpu{customer}, triage.quota.tasks,
// triage.quota.refreshes and triage.quota.task.refresh_age_max (the
// oldest live task's time since its refresh). Without WithCustomers,
// usage and demand are summed over the customers and limit not reported.
func (m *Metrics) QuotaService(a *allocate.Allocator) (metric.Registration, error) {
	in := &instruments{m: m.meter}
	f := m.quotaServiceCallback(in, func() *allocate.Allocator { return a })
	return in.register(f)
}

// quotaServiceCallback creates the quota service's instruments in in and
// returns the callback that observes the allocator get returns (none when
// nil).
func (m *Metrics) quotaServiceCallback(in *instruments, get func() *allocate.Allocator) metric.Callback {
	usage := in.gauge("triage.quota.global.usage_cpu", "{cpu}", "A customer's usage over every live task, CPU-seconds per second, by criticality.")
	demand := in.gauge("triage.quota.global.demand_cpu", "{cpu}", "A customer's estimated demand over every live task, CPU-seconds per second.")
	limit := in.gauge("triage.quota.global.limit_cpu", "{cpu}", "A customer's global limit, CPU-seconds per second.")
	tasks := in.gauge("triage.quota.tasks", "{task}", "Tasks that reported within a lease.")
	refreshes := in.counter("triage.quota.refreshes", "{lease}", "Leases handed out.")
	oldest := in.gauge("triage.quota.task.refresh_age_max", "s", "The longest time since a live task's last refresh.")
	return func(_ context.Context, ob metric.Observer) error {
		a := get()
		if a == nil {
			return nil
		}
		var used [criticality.NumLevels]float64
		var all float64
		for _, g := range a.Usage() {
			if !m.customers {
				for lv, u := range g.Used {
					used[lv] += u
				}
				all += g.Demand
				continue
			}
			cust := keyCustomer.String(g.Customer)
			for _, lv := range criticality.All() {
				ob.ObserveFloat64(usage, g.Used[lv], attrs(cust, keyCriticality.String(lv.String())))
			}
			ob.ObserveFloat64(demand, g.Demand, attrs(cust))
			ob.ObserveFloat64(limit, g.Limit, attrs(cust))
		}
		if !m.customers {
			for _, lv := range criticality.All() {
				ob.ObserveFloat64(usage, used[lv], attrs(keyCriticality.String(lv.String())))
			}
			ob.ObserveFloat64(demand, all)
		}
		ob.ObserveFloat64(tasks, float64(a.Tasks()))
		ob.ObserveInt64(refreshes, int64(a.Refreshes()))
		longest := 0.0
		a.RefreshAges(func(age time.Duration) { longest = math.Max(longest, age.Seconds()) })
		ob.ObserveFloat64(oldest, longest)
		return nil
	}
}

// QuotaReplicaState is what QuotaReplica reads of one replica of the
// quota service (quotareplica.Replica).
type QuotaReplicaState interface {
	Leader() (string, bool)
	IsLeader() bool
	Elections() uint64
	PolicyVersion() int64
	Allocator() *allocate.Allocator
}

// SlowSenderCounter is what SlowSenders reads: a *triagegrpc.Server.
type SlowSenderCounter interface{ SlowSenderRefusals() uint64 }

// QuotaReplica registers a callback for one replica of the quota service
// (quotareplica.Replica): triage.quota.leader{triage.leader},
// triage.quota.granting, triage.quota.elections,
// triage.quota.policy_version, and while it leads, QuotaService's.
func (m *Metrics) QuotaReplica(r QuotaReplicaState) (metric.Registration, error) {
	in := &instruments{m: m.meter}
	leader := in.gauge("triage.quota.leader", "", "1, with the leader this replica of the quota service knows (absent while it knows none).")
	granting := in.gauge("triage.quota.granting", "", "1 while this replica is the leader with a certain etcd session, granting leases.")
	elections := in.counter("triage.quota.elections", "{election}", "Times this replica was elected leader.")
	version := in.gauge("triage.quota.policy_version", "", "Version of the quota policy in force: the etcd revision of its key, or how many times its file was loaded.")
	service := m.quotaServiceCallback(in, r.Allocator)
	return in.register(func(ctx context.Context, ob metric.Observer) error {
		if addr, ok := r.Leader(); ok {
			ob.ObserveFloat64(leader, 1, attrs(keyLeader.String(addr)))
		}
		ob.ObserveFloat64(granting, b2f(r.IsLeader()))
		ob.ObserveInt64(elections, int64(r.Elections()))
		ob.ObserveFloat64(version, float64(r.PolicyVersion()))
		return service(ctx, ob)
	})
}

// ConnLoad registers a callback that reads a connload.Listener's Stats:
// triage.connections.open, .accepted, .delayed, .busy and
// triage.health_checks (rates are the counters').
func (m *Metrics) ConnLoad(l *connload.Listener) (metric.Registration, error) {
	in := &instruments{m: m.meter}
	open := in.gauge("triage.connections.open", "{connection}", "Connections open now.")
	accepted := in.counter("triage.connections.accepted", "{connection}", "Connections accepted.")
	delayed := in.counter("triage.connections.delayed", "{connection}", "Connections that waited for the accept rate or the maximum open before being accepted.")
	busy := in.gauge("triage.connections.busy", "{connection}", "Open connections carrying a call now (the others are idle).")
	checks := in.counter("triage.health_checks", "{check}", "Health checks answered (checks, and health watches opened).")
	return in.register(func(_ context.Context, ob metric.Observer) error {
		s := l.Stats()
		ob.ObserveFloat64(open, float64(s.Open))
		ob.ObserveInt64(accepted, int64(s.Accepted))
		ob.ObserveInt64(delayed, int64(s.Delayed))
		ob.ObserveFloat64(busy, float64(s.Busy))
		ob.ObserveInt64(checks, int64(s.HealthChecks))
		return nil
	})
}

// SlowSenders registers a callback that reads
// triage.slow_sender.refusals: the streams a gRPC server's tap refused as
// a slow sender's (triagegrpc.Server.SlowSenderRefusals).
func (m *Metrics) SlowSenders(s SlowSenderCounter) (metric.Registration, error) {
	in := &instruments{m: m.meter}
	c := in.counter("triage.slow_sender.refusals", "{stream}", "Streams refused at arrival because their connection sent messages past the message timeout (a slow sender's penalty or probation).")
	return in.register(func(_ context.Context, ob metric.Observer) error {
		ob.ObserveInt64(c, int64(s.SlowSenderRefusals()))
		return nil
	})
}

// BalancerMetrics reports the state of load balancers (package balance),
// with attributes target and backend:
// triage.balancer.picks, triage.balancer.active_requests,
// triage.balancer.weight, triage.balancer.backend_state{state}
// and triage.balancer.state_changes{to}. It is the tracker to pass
// to lb.Register(lb.WithMetrics(bm)). It holds the balancers added and
// not removed, each with its subset.
type BalancerMetrics struct {
	mu      sync.Mutex
	tracked map[*balance.Balancer]string
	changes metric.Int64Counter
	reg     metric.Registration
}

// Balancers returns a BalancerMetrics and registers its callback.
func (m *Metrics) Balancers() (*BalancerMetrics, error) {
	changes, err := m.meter.Int64Counter("triage.balancer.state_changes", metric.WithUnit("{change}"),
		metric.WithDescription("Backend state changes seen by a client's load balancer, by target, backend and new state (healthy, refusing, lame_duck)."))
	if err != nil {
		return nil, err
	}
	bm := &BalancerMetrics{tracked: map[*balance.Balancer]string{}, changes: changes}
	in := &instruments{m: m.meter}
	picks := in.counter("triage.balancer.picks", "{request}", "Requests a client's load balancer sent to each backend.")
	active := in.gauge("triage.balancer.active_requests", "{request}", "The client's active requests to each backend (flow control caps them).")
	weight := in.gauge("triage.balancer.weight", "", "Weighted round robin's capability score of each backend (0 before a usable load report).")
	state := in.gauge("triage.balancer.backend_state", "", "1 for each backend's current state as the client sees it.")
	bm.reg, err = in.register(func(_ context.Context, ob metric.Observer) error {
		bm.mu.Lock()
		tracked := make(map[*balance.Balancer]string, len(bm.tracked))
		for b, t := range bm.tracked {
			tracked[b] = t
		}
		bm.mu.Unlock()
		for b, target := range tracked {
			for _, e := range b.Endpoints() {
				t, be := keyTarget.String(target), keyBackend.String(e.ID())
				ob.ObserveInt64(picks, int64(e.Picks()), attrs(t, be))
				ob.ObserveFloat64(active, float64(e.Active()), attrs(t, be))
				ob.ObserveFloat64(weight, e.Weight(), attrs(t, be))
				for _, s := range []balance.State{balance.Refusing, balance.Healthy, balance.LameDuck, balance.Unresponsive} {
					ob.ObserveFloat64(state, b2f(e.State() == s), attrs(t, be, keyState.String(s.String())))
				}
			}
		}
		return nil
	})
	return bm, err
}

// Unregister stops reading the balancers.
func (bm *BalancerMetrics) Unregister() error { return bm.reg.Unregister() }

// Add tracks b under target.
func (bm *BalancerMetrics) Add(target string, b *balance.Balancer) {
	bm.mu.Lock()
	bm.tracked[b] = target
	bm.mu.Unlock()
}

// Remove stops tracking b.
func (bm *BalancerMetrics) Remove(b *balance.Balancer) {
	bm.mu.Lock()
	delete(bm.tracked, b)
	bm.mu.Unlock()
}

// Observer returns the balance.Observer of a balancer of target: it counts
// state changes.
func (bm *BalancerMetrics) Observer(target string) balance.Observer {
	return stateChanges{bm: bm, target: target}
}

type stateChanges struct {
	balance.Nop
	bm     *BalancerMetrics
	target string
}

func (s stateChanges) StateChanged(e *balance.Endpoint, _, to balance.State) {
	s.bm.changes.Add(bg, 1, metric.WithAttributes(keyTarget.String(s.target), keyBackend.String(e.ID()), keyTo.String(to.String())))
}
