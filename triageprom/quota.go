package triageprom

import (
	"time"

	"github.com/triagehq/triage/quota/allocate"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/quota"
)

// Quota returns the metrics of one task's quota enforcement e, and of
// its lease l from the quota service (nil when the task has none): per
// customer and criticality the usage and the limit in force, refusals,
// the fairness threshold, and the lease. Register the Collector once.
//
// Series: triage_quota_usage_cpu{criticality} (CPU-seconds per second),
// triage_quota_demand_cpu, triage_quota_refused_total{criticality},
// triage_quota_threshold, triage_quota_overloaded, and with a Leased
// triage_quota_lease_age_seconds and triage_quota_lease_valid. With
// WithCustomers, usage and demand are labelled by customer too, and
// triage_quota_limit_cpu{customer,criticality} (+Inf when none applies)
// and triage_quota_customer_refused_total{customer} are added; customers
// are those the Usage tracks: at most its MaxTracked plus one.
func (m *Metrics) Quota(e *quota.Enforcer, l *quota.Leased) prometheus.Collector {
	return &quotaMetrics{e: e, l: l, customers: m.customers}
}

// quotaMetrics is Quota's Collector.
type quotaMetrics struct {
	e         *quota.Enforcer
	l         *quota.Leased
	customers bool
}

var (
	descQuotaUsage     = prometheus.NewDesc("triage_quota_usage_cpu", "A customer's CPU usage on this task, CPU-seconds per second, by criticality.", []string{"customer", "criticality"}, nil)
	descQuotaLimit     = prometheus.NewDesc("triage_quota_limit_cpu", "The limit this task enforces for a customer, CPU-seconds per second, by criticality (+Inf: none).", []string{"customer", "criticality"}, nil)
	descQuotaDemand    = prometheus.NewDesc("triage_quota_demand_cpu", "A customer's estimated demand on this task (usage plus refused requests at its mean cost), CPU-seconds per second.", []string{"customer"}, nil)
	descQuotaCRefused  = prometheus.NewDesc("triage_quota_customer_refused_total", "Requests of a customer refused out of quota on this task.", []string{"customer"}, nil)
	descQuotaRefused   = prometheus.NewDesc("triage_quota_refused_total", "Requests refused out of quota on this task, by criticality.", []string{"criticality"}, nil)
	descQuotaThreshold = prometheus.NewDesc("triage_quota_threshold", "The fairness threshold on usage/limit above which customers are refused while the task is overloaded (+Inf when it is not).", nil, nil)
	descQuotaOverload  = prometheus.NewDesc("triage_quota_overloaded", "1 while the task counts as overloaded, so soft limits apply.", nil, nil)
	descLeaseAge       = prometheus.NewDesc("triage_quota_lease_age_seconds", "Time since the last lease from the quota service (absent before the first).", nil, nil)
	descLeaseValid     = prometheus.NewDesc("triage_quota_lease_valid", "1 while the lease from the quota service is valid; 0 when the fallback applies.", nil, nil)

	descQuotaUsageAll  = prometheus.NewDesc("triage_quota_usage_cpu", "The customers' CPU usage on this task, CPU-seconds per second, by criticality.", []string{"criticality"}, nil)
	descQuotaDemandAll = prometheus.NewDesc("triage_quota_demand_cpu", "The customers' estimated demand on this task (usage plus refused requests at their mean cost), CPU-seconds per second.", nil, nil)
)

// Describe implements prometheus.Collector.
func (q *quotaMetrics) Describe(ch chan<- *prometheus.Desc) {
	ds := []*prometheus.Desc{descQuotaUsageAll, descQuotaDemandAll}
	if q.customers {
		ds = []*prometheus.Desc{descQuotaUsage, descQuotaLimit, descQuotaDemand, descQuotaCRefused}
	}
	for _, d := range append(ds, descQuotaRefused, descQuotaThreshold, descQuotaOverload, descLeaseAge, descLeaseValid) {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (q *quotaMetrics) Collect(ch chan<- prometheus.Metric) {
	if q.customers {
		q.collectCustomers(ch)
	} else {
		var used [criticality.NumLevels]float64
		var demand float64
		for _, c := range q.e.Usage().Snapshot() {
			for l, u := range c.Used {
				used[l] += u
			}
			demand += c.Demand
		}
		for _, l := range criticality.All() {
			ch <- prometheus.MustNewConstMetric(descQuotaUsageAll, prometheus.GaugeValue, used[l], l.String())
		}
		ch <- prometheus.MustNewConstMetric(descQuotaDemandAll, prometheus.GaugeValue, demand)
	}
	for _, l := range criticality.All() {
		ch <- prometheus.MustNewConstMetric(descQuotaRefused, prometheus.CounterValue, float64(q.e.Refused(l)), l.String())
	}
	ch <- prometheus.MustNewConstMetric(descQuotaThreshold, prometheus.GaugeValue, q.e.Threshold())
	ch <- prometheus.MustNewConstMetric(descQuotaOverload, prometheus.GaugeValue, b2f(q.e.Overloaded()))
	if q.l != nil {
		if age, ok := q.l.Age(); ok {
			ch <- prometheus.MustNewConstMetric(descLeaseAge, prometheus.GaugeValue, age.Seconds())
		}
		ch <- prometheus.MustNewConstMetric(descLeaseValid, prometheus.GaugeValue, b2f(!q.l.Expired()))
	}
}

// collectCustomers sends the series labelled by customer.
func (q *quotaMetrics) collectCustomers(ch chan<- prometheus.Metric) {
	limits := q.e.Limits()
	for _, c := range q.e.Usage().Snapshot() {
		for _, l := range criticality.All() {
			ch <- prometheus.MustNewConstMetric(descQuotaUsage, prometheus.GaugeValue, c.Used[l], c.Customer, l.String())
			lim, _ := limits.Limit(c.Customer, l)
			ch <- prometheus.MustNewConstMetric(descQuotaLimit, prometheus.GaugeValue, lim, c.Customer, l.String())
		}
		ch <- prometheus.MustNewConstMetric(descQuotaDemand, prometheus.GaugeValue, c.Demand, c.Customer)
		ch <- prometheus.MustNewConstMetric(descQuotaCRefused, prometheus.CounterValue, float64(c.Refused), c.Customer)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// QuotaService returns the metrics of the quota service's view, a:
// triage_quota_global_usage_cpu{criticality},
// triage_quota_global_demand_cpu, triage_quota_tasks,
// triage_quota_refreshes_total and triage_quota_task_refresh_age_max_seconds
// (the longest time since a live task refreshed: a task falling behind).
// With WithCustomers, usage and demand are labelled by customer too and
// triage_quota_global_limit_cpu{customer} is added; customers are those
// the live tasks report.
func (m *Metrics) QuotaService(a *allocate.Allocator) prometheus.Collector {
	return &quotaServiceMetrics{a: a, customers: m.customers}
}

// quotaServiceMetrics is QuotaService's Collector.
type quotaServiceMetrics struct {
	a         *allocate.Allocator
	customers bool
}

var (
	descGlobalUsage  = prometheus.NewDesc("triage_quota_global_usage_cpu", "A customer's usage over every live task, CPU-seconds per second, by criticality.", []string{"customer", "criticality"}, nil)
	descGlobalDemand = prometheus.NewDesc("triage_quota_global_demand_cpu", "A customer's estimated demand over every live task, CPU-seconds per second.", []string{"customer"}, nil)
	descGlobalLimit  = prometheus.NewDesc("triage_quota_global_limit_cpu", "A customer's global limit, CPU-seconds per second.", []string{"customer"}, nil)
	descQuotaTasks   = prometheus.NewDesc("triage_quota_tasks", "Tasks that reported within a lease.", nil, nil)
	descRefreshes    = prometheus.NewDesc("triage_quota_refreshes_total", "Leases handed out.", nil, nil)
	descRefreshAge   = prometheus.NewDesc("triage_quota_task_refresh_age_max_seconds", "The longest time since a live task's last refresh.", nil, nil)

	descGlobalUsageAll  = prometheus.NewDesc("triage_quota_global_usage_cpu", "The customers' usage over every live task, CPU-seconds per second, by criticality.", []string{"criticality"}, nil)
	descGlobalDemandAll = prometheus.NewDesc("triage_quota_global_demand_cpu", "The customers' estimated demand over every live task, CPU-seconds per second.", nil, nil)
)

// Describe implements prometheus.Collector.
func (q *quotaServiceMetrics) Describe(ch chan<- *prometheus.Desc) {
	ds := []*prometheus.Desc{descGlobalUsageAll, descGlobalDemandAll}
	if q.customers {
		ds = []*prometheus.Desc{descGlobalUsage, descGlobalDemand, descGlobalLimit}
	}
	for _, d := range append(ds, descQuotaTasks, descRefreshes, descRefreshAge) {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (q *quotaServiceMetrics) Collect(ch chan<- prometheus.Metric) {
	var used [criticality.NumLevels]float64
	var demand float64
	for _, g := range q.a.Usage() {
		if !q.customers {
			for l, u := range g.Used {
				used[l] += u
			}
			demand += g.Demand
			continue
		}
		for _, l := range criticality.All() {
			ch <- prometheus.MustNewConstMetric(descGlobalUsage, prometheus.GaugeValue, g.Used[l], g.Customer, l.String())
		}
		ch <- prometheus.MustNewConstMetric(descGlobalDemand, prometheus.GaugeValue, g.Demand, g.Customer)
		ch <- prometheus.MustNewConstMetric(descGlobalLimit, prometheus.GaugeValue, g.Limit, g.Customer)
	}
	if !q.customers {
		for _, l := range criticality.All() {
			ch <- prometheus.MustNewConstMetric(descGlobalUsageAll, prometheus.GaugeValue, used[l], l.String())
		}
		ch <- prometheus.MustNewConstMetric(descGlobalDemandAll, prometheus.GaugeValue, demand)
	}
	ch <- prometheus.MustNewConstMetric(descQuotaTasks, prometheus.GaugeValue, float64(q.a.Tasks()))
	ch <- prometheus.MustNewConstMetric(descRefreshes, prometheus.CounterValue, float64(q.a.Refreshes()))
	var longest time.Duration
	q.a.RefreshAges(func(age time.Duration) { longest = max(longest, age) })
	ch <- prometheus.MustNewConstMetric(descRefreshAge, prometheus.GaugeValue, longest.Seconds())
}

// QuotaReplicaState is what QuotaReplica reads of one replica of the quota
// service (quotareplica.Replica).
type QuotaReplicaState interface {
	Leader() (string, bool)
	IsLeader() bool
	Elections() uint64
	PolicyVersion() int64
	Allocator() *allocate.Allocator
}

// QuotaReplica returns the metrics of replica r of the quota service: triage_quota_leader (the leader this replica knows, by
// address), triage_quota_granting (1 while this replica grants),
// triage_quota_elections_total (times it was elected),
// triage_quota_policy_version (the etcd revision of the policy in force,
// or the file's load count), and, while it leads, the leader's
// QuotaService metrics. The Collector is safe for concurrent use.
func (m *Metrics) QuotaReplica(r QuotaReplicaState) prometheus.Collector {
	return &quotaReplicaMetrics{r: r, customers: m.customers}
}

// quotaReplicaMetrics is QuotaReplica's Collector.
type quotaReplicaMetrics struct {
	r         QuotaReplicaState
	customers bool
}

var (
	descQuotaLeader    = prometheus.NewDesc("triage_quota_leader", "1, labelled with the leader this replica of the quota service knows (absent while it knows none).", []string{"leader"}, nil)
	descQuotaGranting  = prometheus.NewDesc("triage_quota_granting", "1 while this replica is the leader with a certain etcd session, granting leases.", nil, nil)
	descQuotaElections = prometheus.NewDesc("triage_quota_elections_total", "Times this replica was elected leader.", nil, nil)
	descPolicyVersion  = prometheus.NewDesc("triage_quota_policy_version", "Version of the quota policy in force: the etcd revision of its key, or how many times its file was loaded.", nil, nil)
)

// Describe implements prometheus.Collector.
func (q *quotaReplicaMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQuotaLeader, descQuotaGranting, descQuotaElections, descPolicyVersion} {
		ch <- d
	}
	(&quotaServiceMetrics{customers: q.customers}).Describe(ch)
}

// Collect implements prometheus.Collector.
func (q *quotaReplicaMetrics) Collect(ch chan<- prometheus.Metric) {
	if addr, ok := q.r.Leader(); ok {
		ch <- prometheus.MustNewConstMetric(descQuotaLeader, prometheus.GaugeValue, 1, addr)
	}
	granting := 0.0
	if q.r.IsLeader() {
		granting = 1
	}
	ch <- prometheus.MustNewConstMetric(descQuotaGranting, prometheus.GaugeValue, granting)
	ch <- prometheus.MustNewConstMetric(descQuotaElections, prometheus.CounterValue, float64(q.r.Elections()))
	ch <- prometheus.MustNewConstMetric(descPolicyVersion, prometheus.GaugeValue, float64(q.r.PolicyVersion()))
	if a := q.r.Allocator(); a != nil {
		(&quotaServiceMetrics{a: a, customers: q.customers}).Collect(ch)
	}
}
