package triageprom_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/triageprom"
)

// A client of an always-overloaded HTTP backend, over loopback: the
// metrics count its requests, rejections, retries and budget refusals.
func TestClientMetricsOverLoopback(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		triagehttp.WriteError(w, outcome.New(outcome.TaskOverloaded, "test"))
	}))
	defer backend.Close()
	m := triageprom.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	p, err := retry.New(retry.WithObserver(m.Client("backend")), retry.WithBackoff(0, 0), retry.WithoutThrottle())
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &triagehttp.Transport{Caller: loopback.Caller(t, egress.WithPolicy(p))}}
	for i := 0; i < 20; i++ {
		resp, err := hc.Get(backend.URL)
		if err == nil {
			resp.Body.Close()
			t.Fatal("an overloaded backend's 503 came back as a response, not as a give-up error")
		}
		if !errors.Is(err, outcome.ErrDontRetry) {
			t.Fatalf("err %v", err)
		}
	}
	get := func(name string) float64 {
		v, err := testutil.GatherAndCount(reg, name)
		if err != nil || v == 0 {
			t.Fatalf("%s: %v series, %v", name, v, err)
		}
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, s := range mf.GetMetric() {
				for _, lp := range s.GetLabel() {
					if lp.GetName() == "criticality" && lp.GetValue() == "CRITICAL" {
						return s.GetCounter().GetValue()
					}
				}
			}
		}
		return -1
	}
	req, rej, retries, refused := get("triage_client_requests_total"), get("triage_client_backend_rejections_total"),
		get("triage_client_retries_total"), get("triage_client_retry_budget_refusals_total")
	if req != 20 || retries < 2 || retries > 4 || refused == 0 || rej != req+retries {
		t.Fatalf("requests %v, rejections %v, retries %v, refusals %v", req, rej, retries, refused)
	}
	if n := testutil.CollectAndCount(m, "triage_client_throttled_total"); n != 4 {
		t.Fatalf("%d throttled series, want one per criticality", n)
	}
}
