package triageprom_test

import (
	"strings"
	"testing"
	"time"

	"github.com/triagehq/triage/quota/allocate"
	"github.com/triagehq/triage/quota/usage"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triageprom"
)

// The task's quota metrics show usage, limits and refusals per customer
// and criticality, and the lease's age; the service's show global usage.
func TestQuotaMetrics(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	p, _ := quota.New(quota.Config{Customers: map[string]quota.Limit{"ads": {CPU: 0.001, Hard: true}}})
	u, _ := usage.New(usage.WithClock(clk))
	l := quota.NewLeased(clk, p)
	a, _ := allocate.New(p, allocate.WithClock(clk))
	e, _ := quota.NewEnforcer(p, u)
	for range 10 {
		if _, err := e.Reserve("ads", criticality.Sheddable); err == nil {
			u.Add("ads", criticality.Sheddable, 10*time.Millisecond)
		}
		clk.Advance(10 * time.Millisecond)
	}
	ls, err := a.Refresh(quota.Report{Task: "t1", Customers: u.Snapshot()})
	if err != nil {
		t.Fatal(err)
	}
	l.Set(ls)
	clk.Advance(time.Second)
	m := triageprom.New(triageprom.WithCustomers())
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m.Quota(e, l), m.QuotaService(a))
	want := `
# HELP triage_quota_customer_refused_total Requests of a customer refused out of quota on this task.
# TYPE triage_quota_customer_refused_total counter
triage_quota_customer_refused_total{customer="ads"} 9
# HELP triage_quota_lease_age_seconds Time since the last lease from the quota service (absent before the first).
# TYPE triage_quota_lease_age_seconds gauge
triage_quota_lease_age_seconds 1
# HELP triage_quota_lease_valid 1 while the lease from the quota service is valid; 0 when the fallback applies.
# TYPE triage_quota_lease_valid gauge
triage_quota_lease_valid 1
# HELP triage_quota_tasks Tasks that reported within a lease.
# TYPE triage_quota_tasks gauge
triage_quota_tasks 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "triage_quota_customer_refused_total", "triage_quota_lease_age_seconds", "triage_quota_lease_valid", "triage_quota_tasks"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg, "triage_quota_refused_total", "triage_quota_limit_cpu", "triage_quota_global_usage_cpu"); err != nil || n != 12 {
		t.Errorf("%d series (%v), want 4 refused + 4 limits + 4 global usage", n, err)
	}
}

// The quota service reports how long ago each live task last refreshed,
// as a histogram over the tasks (bounded, whatever their number), and a
// replica its leader, whether it grants, its elections and policy version.
func TestQuotaServiceRefreshAges(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	p, _ := quota.New(quota.Config{Tasks: 3})
	a, _ := allocate.New(p, allocate.WithClock(clk), allocate.WithLease(30*time.Second))
	for _, task := range []string{"t1", "t2", "t3"} {
		if _, err := a.Refresh(quota.Report{Task: task}); err != nil {
			t.Fatal(err)
		}
		clk.Advance(3 * time.Second)
	}
	// Ages now 9, 6 and 3 s.
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(triageprom.New().QuotaReplica(fakeReplica{a}))
	want := `
# HELP triage_quota_elections_total Times this replica was elected leader.
# TYPE triage_quota_elections_total counter
triage_quota_elections_total 2
# HELP triage_quota_granting 1 while this replica is the leader with a certain etcd session, granting leases.
# TYPE triage_quota_granting gauge
triage_quota_granting 1
# HELP triage_quota_leader 1, labelled with the leader this replica of the quota service knows (absent while it knows none).
# TYPE triage_quota_leader gauge
triage_quota_leader{leader="10.0.0.5:7070"} 1
# HELP triage_quota_policy_version Version of the quota policy in force: the etcd revision of its key, or how many times its file was loaded.
# TYPE triage_quota_policy_version gauge
triage_quota_policy_version 42
# HELP triage_quota_task_refresh_age_max_seconds The longest time since a live task's last refresh.
# TYPE triage_quota_task_refresh_age_max_seconds gauge
triage_quota_task_refresh_age_max_seconds 9
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "triage_quota_elections_total", "triage_quota_granting", "triage_quota_leader",
		"triage_quota_policy_version", "triage_quota_task_refresh_age_max_seconds"); err != nil {
		t.Error(err)
	}
}

// Without WithCustomers no series names a customer: usage and demand are
// summed over the customers (by criticality), refusals counted by
// criticality, and limits, which are a customer's, are not exported.
func TestQuotaMetricsWithoutCustomers(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	p, _ := quota.New(quota.Config{Customers: map[string]quota.Limit{"ads": {CPU: 1}, "search": {CPU: 1}}})
	u, _ := usage.New(usage.WithClock(clk))
	a, _ := allocate.New(p, allocate.WithClock(clk))
	e, _ := quota.NewEnforcer(p, u)
	for range 10 {
		u.Add("ads", criticality.Sheddable, 10*time.Millisecond)
		u.Add("search", criticality.Sheddable, 30*time.Millisecond)
		clk.Advance(100 * time.Millisecond)
	}
	if _, err := a.Refresh(quota.Report{Task: "t1", Customers: u.Snapshot()}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	m := triageprom.New()
	reg.MustRegister(m.Quota(e, nil), m.QuotaService(a))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]float64{}
	for _, mf := range mfs {
		for _, s := range mf.Metric {
			for _, l := range s.Label {
				if l.GetName() == "customer" {
					t.Errorf("%s names a customer (%s)", mf.GetName(), l.GetValue())
				}
			}
			if len(s.Label) == 1 && s.Label[0].GetValue() == "SHEDDABLE" || len(s.Label) == 0 {
				sums[mf.GetName()] += s.GetGauge().GetValue()
			}
		}
	}
	var want float64
	for _, c := range u.Snapshot() {
		want += c.Used[criticality.Sheddable]
	}
	if want == 0 {
		t.Fatal("no usage recorded")
	}
	for _, name := range []string{"triage_quota_usage_cpu", "triage_quota_global_usage_cpu"} {
		if got := sums[name]; got < 0.99*want || got > 1.01*want {
			t.Errorf("%s{criticality=SHEDDABLE} = %v, want the customers' sum %v", name, got, want)
		}
	}
	if n, _ := testutil.GatherAndCount(reg, "triage_quota_limit_cpu", "triage_quota_global_limit_cpu", "triage_quota_customer_refused_total"); n != 0 {
		t.Errorf("%d series of a customer's limit or refusals, want none", n)
	}
	if n, _ := testutil.GatherAndCount(reg, "triage_quota_demand_cpu", "triage_quota_global_demand_cpu"); n != 2 {
		t.Errorf("%d demand series, want one each for the task and the service", n)
	}
}

type fakeReplica struct{ a *allocate.Allocator }

func (fakeReplica) Leader() (string, bool)           { return "10.0.0.5:7070", true }
func (fakeReplica) IsLeader() bool                   { return true }
func (fakeReplica) Elections() uint64                { return 2 }
func (fakeReplica) PolicyVersion() int64             { return 42 }
func (f fakeReplica) Allocator() *allocate.Allocator { return f.a }
