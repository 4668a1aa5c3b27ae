package triageprom_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/triageprom"
	"github.com/triagehq/triage/trust"
)

func TestMetricsFromTheMiddleware(t *testing.T) {
	m := triageprom.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	cl := edge.MustNew(edge.Config{Rules: []edge.RuleConfig{{Header: true}, {PathPrefix: "/suggest", Criticality: "SHEDDABLE"}}}, edge.WithObserver(m))
	mw, err := triagehttp.Middleware(triagehttp.WithIntake(intake.WithClassifier(cl), intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"10.0.0.0/8"}}))))
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	send := func(remote, path string, hdr map[string]string) {
		r := httptest.NewRequest("GET", path, nil)
		r.RemoteAddr = remote
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	send("192.0.2.1:1", "/suggest", map[string]string{"Triage-Criticality": "CRITICAL_PLUS", "Triage-Secret-Sauce": "1"})
	send("192.0.2.1:1", "/", nil)
	send("10.1.1.1:1", "/", map[string]string{"Triage-Criticality": "SHEDDABLE_PLUS"})
	send("10.1.1.1:1", "/", map[string]string{"Triage-Criticality": "bogus"})

	want := `
# HELP triage_untrusted_keys_stripped_total Triage metadata keys or headers sent by untrusted peers and removed, by key (registered name, or 'unregistered').
# TYPE triage_untrusted_keys_stripped_total counter
triage_untrusted_keys_stripped_total{key="triage-attempt"} 0
triage_untrusted_keys_stripped_total{key="triage-criticality"} 1
triage_untrusted_keys_stripped_total{key="triage-criticality-decay"} 0
triage_untrusted_keys_stripped_total{key="triage-customer"} 0
triage_untrusted_keys_stripped_total{key="triage-lame-duck"} 0
triage_untrusted_keys_stripped_total{key="triage-outcome"} 0
triage_untrusted_keys_stripped_total{key="triage-quota-leader"} 0
triage_untrusted_keys_stripped_total{key="unregistered"} 1
# HELP triage_edge_invalid_header_total Requests from trusted peers whose criticality header was malformed and ignored.
# TYPE triage_edge_invalid_header_total counter
triage_edge_invalid_header_total 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "triage_untrusted_keys_stripped_total", "triage_edge_invalid_header_total"); err != nil {
		t.Fatal(err)
	}
	count := func(l criticality.Level, rule, trusted string) float64 {
		return series(t, reg, "triage_edge_requests_total", "criticality", l.String(), "rule", rule, "trusted", trusted)
	}
	if got := count(criticality.Sheddable, "path", "false"); got != 1 {
		t.Errorf("SHEDDABLE by path rule = %v", got)
	}
	if got := count(criticality.Critical, "default", "false"); got != 1 {
		t.Errorf("CRITICAL by default, untrusted = %v", got)
	}
	if got := count(criticality.SheddablePlus, "header", "true"); got != 1 {
		t.Errorf("SHEDDABLE_PLUS by header, trusted = %v", got)
	}
	if got := count(criticality.Critical, "default", "true"); got != 1 {
		t.Errorf("CRITICAL by default after an invalid header = %v", got)
	}
	if got := testutil.CollectAndCount(m, "triage_edge_requests_total"); got != 4*5*2 {
		t.Errorf("%d edge series, want all 40 created up front", got)
	}
}

func BenchmarkClassified(b *testing.B) {
	m := triageprom.New()
	d := edge.Decision{Level: criticality.Sheddable, Rule: edge.Host, Trusted: true}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Classified(d)
		}
	})
}
