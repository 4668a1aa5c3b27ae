package app

import (
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/triagehq/triage/quota/allocate"
	"github.com/triagehq/triage/quota/usage"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/quota"
)

// The quota service names customers in its metrics only with
// -metrics-customers.
func TestQuotaServerMetricsCustomers(t *testing.T) {
	pol, _ := quota.New(quota.Config{Customers: map[string]quota.Limit{"ads": {CPU: 1}}})
	alloc, _ := allocate.New(pol)
	table, _ := usage.New()
	table.Add("ads", criticality.Critical, time.Second)
	if _, err := alloc.Refresh(quota.Report{Task: "t1", Customers: table.Snapshot()}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want bool
	}{{nil, false}, {[]string{"-metrics-customers"}, true}} {
		var f quotaServerFlags
		fs := flag.NewFlagSet("quota-server", flag.ContinueOnError)
		f.register(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(f.promMetrics().QuotaService(alloc))
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var named bool
		for _, mf := range mfs {
			for _, m := range mf.Metric {
				for _, l := range m.Label {
					named = named || l.GetName() == "customer" && l.GetValue() == "ads"
				}
			}
		}
		if named != tc.want {
			t.Errorf("quota-server %s: a series names the customer: %v, want %v", strings.Join(tc.args, " "), named, tc.want)
		}
	}
}
