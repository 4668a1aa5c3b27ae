package triagehttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/trust"
)

// net/http reads each request and runs its handler on one goroutine, so
// on a saturated CPU the excess waits in Go's run queue before the
// middleware sees it, and admission's pending count is always zero: a
// server that followed the README answered nothing in time at 2x its
// capacity on one CPU, and refused nothing. The middleware marks its
// requests RunQueued, and while the queueing delay is over the target
// admission sheds them by criticality: here the delay is 60 times the
// target, and SHEDDABLE is refused while CRITICAL_PLUS is served.
func TestHTTPShedsWhatWaitedInTheRunQueue(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	ctl, err := admission.New(admission.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := triagehttp.Middleware(triagehttp.WithAdmission(ctl), triagehttp.WithClock(clk),
		triagehttp.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, criticality.Of(r.Context()).String())
	})))
	defer srv.Close()
	get := func(l criticality.Level) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL, nil)
		req.Header.Set("Triage-Criticality", l.String())
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get(criticality.Sheddable); code != 200 {
		t.Fatalf("no queue: SHEDDABLE answered %d", code)
	}
	// Work admitted elsewhere on the same controller waited 300 ms between
	// arriving and starting, for three intervals: the queueing delay the
	// controller measures (on the real clock, Go's run queue's).
	for range 3 {
		var tk admission.Ticket
		if err := ctl.Arrive(&tk, criticality.CriticalPlus, 0, time.Time{}); err != nil {
			t.Fatal(err)
		}
		clk.Advance(300 * time.Millisecond)
		if err := ctl.Start(t.Context(), &tk); err != nil {
			t.Fatal(err)
		}
		ctl.Done(&tk)
		clk.Advance(admission.DefaultInterval)
	}
	code, body := get(criticality.Sheddable)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "queue") {
		t.Errorf("SHEDDABLE with the run queue 60x its target: %d %q, want 503 for the queue", code, body)
	}
	if code, body := get(criticality.CriticalPlus); code != 200 || body != "CRITICAL_PLUS" {
		t.Errorf("CRITICAL_PLUS with the run queue 60x its target: %d %q, want served", code, body)
	}
	if s := ctl.Stats().QueueShed; s[criticality.Sheddable] != 1 || s[criticality.CriticalPlus] != 0 {
		t.Errorf("QueueShed %v", s)
	}
}
