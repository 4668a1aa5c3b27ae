package triagehttp_test

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/shadow"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/triageprom"
	"github.com/triagehq/triage/trust"
)

// With every mechanism in shadow, a server whose admission control would
// refuse everything (its signal at 10x its target) and which black-holes
// a client type answers every request with its handler, and reports what
// it would have refused in its metrics and in a sampled log line; with
// shadow off, the same server refuses.
func TestShadowChangesNoAnswer(t *testing.T) {
	for _, inShadow := range []bool{true, false} {
		m := triageprom.New()
		ctl, err := admission.New(admission.WithSignal(fixedSignal(10), admission.DefaultThresholds()), admission.WithObserver(m.Admission()))
		if err != nil {
			t.Fatal(err)
		}
		iso, _ := isolate.New(isolate.Config{Clients: []isolate.Client{{Name: "rogue", Hosts: []string{"rogue.example.com"}, Route: "black-hole"}}})
		var logs bytes.Buffer
		lg := shadow.NewLog(slog.New(slog.NewTextHandler(&logs, nil)), 0, clock.NewFake(time.Unix(0, 0))) // the second never ends
		opts := []triagehttp.Option{triagehttp.WithAdmission(ctl), triagehttp.WithIntake(intake.WithIsolation(iso),
			intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})))}
		if inShadow {
			opts = append(opts, triagehttp.WithIntake(intake.WithShadow(shadow.All(), shadow.Tee(m.Shadow(), lg))))
		}
		mw, err := triagehttp.Middleware(opts...)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "served") })))
		answers := map[int]int{}
		for i := range 20 {
			req, _ := http.NewRequest("GET", srv.URL, nil)
			req.Header.Set("Triage-Criticality", "SHEDDABLE")
			if i%2 == 1 {
				req.Host = "rogue.example.com"
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			answers[resp.StatusCode]++
		}
		srv.Close()
		if !inShadow {
			if answers[200] != 0 {
				t.Errorf("enforcing: %v, want every request refused", answers)
			}
			continue
		}
		if answers[200] != 20 {
			t.Errorf("shadow: answers %v, want 20 served", answers)
		}
		reg := prometheus.NewRegistry()
		reg.MustRegister(m)
		util := testutil.ToFloat64(metric(t, reg, "admission", "utilization"))
		hole := testutil.ToFloat64(metric(t, reg, "isolation", "black-hole"))
		if util != 10 || hole != 10 {
			t.Errorf("would refuse: %v for utilization and %v for the black hole, want 10 and 10", util, hole)
		}
		if n := sumOf(t, reg, "triage_admission_rejected_total"); n != 0 {
			t.Errorf("in shadow, triage_admission_rejected_total counts %v rejections; nothing was refused", n)
		}
		if !strings.Contains(logs.String(), "shadow: would have refused") || !strings.Contains(logs.String(), "utilization.SHEDDABLE=1") {
			t.Errorf("no sampled log line: %q", logs.String())
		}
		if n := strings.Count(logs.String(), "mechanism=admission"); n != 1 {
			t.Errorf("%d log lines for admission within one second of the log's clock, want 1 (sampled)", n)
		}
	}
}

// metric returns the shadow counter of one mechanism and reason for
// SHEDDABLE.
func metric(t *testing.T, reg *prometheus.Registry, mechanism, reason string) prometheus.Collector {
	t.Helper()
	return collectorFunc(func(ch chan<- prometheus.Metric) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "triage_shadow_would_refuse_total" {
				continue
			}
			for _, mm := range mf.GetMetric() {
				labels := map[string]string{}
				for _, lp := range mm.GetLabel() {
					labels[lp.GetName()] = lp.GetValue()
				}
				if labels["mechanism"] == mechanism && labels["reason"] == reason && labels["criticality"] == "SHEDDABLE" {
					ch <- prometheus.MustNewConstMetric(prometheus.NewDesc("x", "x", nil, nil), prometheus.CounterValue, mm.GetCounter().GetValue())
				}
			}
		}
	})
}

type collectorFunc func(chan<- prometheus.Metric)

func (f collectorFunc) Describe(chan<- *prometheus.Desc)    {}
func (f collectorFunc) Collect(ch chan<- prometheus.Metric) { f(ch) }

// sumOf returns the sum of a counter family's series.
func sumOf(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// In shadow, a body slower than the message timeout is not refused: the
// request is served as without triage, and the refusal it would have had
// is counted (issue 55: `triage sidecar -shadow` answered 408).
func TestShadowServesASlowBody(t *testing.T) {
	m := triageprom.New()
	f := clock.NewFake(time.Unix(0, 0))
	ctl, err := admission.New(admission.WithClock(f), admission.WithMessageTimeout(20*time.Millisecond), admission.WithObserver(m.Admission()))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := triagehttp.Middleware(triagehttp.WithAdmission(ctl), triagehttp.WithIntake(intake.WithClock(f), intake.WithShadow(shadow.All(), m.Shadow()),
		intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}}))))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	})))
	defer srv.Close()
	// With Expect: 100-continue the client sends the body only once the
	// server reads it (the middleware's read-ahead): the body comes 150 ms
	// of the server's clock after that, well past the message timeout.
	body := &clockedBody{f: f, late: 150 * time.Millisecond, data: []byte("0123456789")}
	req, _ := http.NewRequest("POST", srv.URL, body)
	req.ContentLength = 10
	req.Header.Set("Expect", "100-continue")
	req.Header.Set("Triage-Criticality", "SHEDDABLE")
	client := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: time.Minute}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(got) != "0123456789" {
		t.Fatalf("a slow body in shadow: %d %q, want 200 and the body", resp.StatusCode, got)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	if n := testutil.ToFloat64(metric(t, reg, "admission", "late")); n != 1 {
		t.Errorf("would refuse for a late body: %v, want 1", n)
	}
}

// clockedBody is a request body that advances f by late when it is first
// read, then gives data.
type clockedBody struct {
	f    *clock.Fake
	late time.Duration
	data []byte
	read bool
}

func (b *clockedBody) Read(p []byte) (int, error) {
	if !b.read {
		b.read = true
		b.f.Advance(b.late)
	}
	if len(b.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p, b.data)
	b.data = b.data[n:]
	return n, nil
}
