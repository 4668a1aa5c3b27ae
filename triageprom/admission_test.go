package triageprom_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/triageprom"
)

// An HTTP backend with admission control (one slot, a short queue) over
// loopback: excess requests get 503 "task overloaded", and the metrics
// count admissions and rejections and show the controller's state.
func TestAdmissionMetricsOverLoopbackHTTP(t *testing.T) {
	m := triageprom.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	ctl, err := admission.New(admission.WithObserver(m.Admission()), admission.WithLimits(1, 1, 1),
		admission.WithQueueFactor(0), admission.WithMaxWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(triageprom.AdmissionState(ctl))
	mw, err := triagehttp.Middleware(triagehttp.WithAdmission(ctl))
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	entered := make(chan struct{}, 64)
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
	})))
	defer srv.Close()
	var wg sync.WaitGroup
	codes := make(chan int, 64)
	get := func() {
		defer wg.Done()
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Error(err)
			return
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			if oe, ok := triagehttp.FromResponse(resp); !ok || oe.Kind != outcome.TaskOverloaded {
				t.Errorf("a 503 without the outcome header: %v", resp.Header)
			}
		}
		codes <- resp.StatusCode
	}
	wg.Add(1)
	go get()
	<-entered
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go get()
	}
	// 8 wait for the slot; the rest are refused.
	rejected := 0
	for rejected < 12 {
		if c := <-codes; c == http.StatusServiceUnavailable {
			rejected++
		} else {
			t.Fatalf("status %d while the slot is held", c)
		}
	}
	if st := ctl.Stats(); st.Queued != 8 || st.Executing != 1 {
		t.Fatalf("state %+v", st)
	}
	if n := series(t, reg, "triage_admission_rejected_total", "criticality", "CRITICAL", "reason", "concurrency", "answer", "task-overloaded"); n != 12 {
		t.Fatalf("rejected counter %v", n)
	}
	if n, err := testutil.GatherAndCount(reg, "triage_admission_queued", "triage_admission_pending_cap", "triage_admission_away", "triage_admission_stalled"); err != nil || n != 4 {
		t.Fatalf("state series %d, %v", n, err)
	}
	close(release)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Fatalf("status %d after release", c)
		}
	}
	if n := series(t, reg, "triage_admission_admitted_total", "criticality", "CRITICAL"); n != 9 {
		t.Fatalf("admitted %v, want 9", n)
	}
	// A drill in effect shows.
	if err := ctl.ForceShed(criticality.Sheddable, 0.25, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP triage_admission_forced_shed_ratio Fraction of the criticality's requests a ForceShed drill rejects now (0: no drill).
# TYPE triage_admission_forced_shed_ratio gauge
triage_admission_forced_shed_ratio{criticality="CRITICAL"} 0
triage_admission_forced_shed_ratio{criticality="CRITICAL_PLUS"} 0
triage_admission_forced_shed_ratio{criticality="SHEDDABLE"} 0.25
triage_admission_forced_shed_ratio{criticality="SHEDDABLE_PLUS"} 0
`), "triage_admission_forced_shed_ratio"); err != nil {
		t.Fatal(err)
	}
	// The attempt histogram: every request arrived as a first attempt of
	// the default criticality (an untrusted peer's attempt header is not
	// believed).
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := 0
	for _, mf := range mfs {
		if mf.GetName() != "triage_admission_attempts_total" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			series++
			labels := map[string]string{}
			for _, lp := range mt.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			want := 0.0
			if labels["criticality"] == "CRITICAL" && labels["attempt"] == "0" {
				want = 21
			}
			if v := mt.GetCounter().GetValue(); v != want {
				t.Errorf("attempts %v = %v, want %v", labels, v, want)
			}
		}
	}
	if series != 12 {
		t.Fatalf("%d attempt series, want 12 (4 criticalities x 3 attempt values)", series)
	}
}
