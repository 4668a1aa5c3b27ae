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
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/trust"
)

// net/http reads each request and runs its handler on one goroutine, so
// on a saturated CPU the excess waits in Go's run queue before the
// middleware sees it, and admission's pending count is always zero: a
// server that followed the README answered nothing in time at 2x its
// capacity on one CPU, and refused nothing. The middleware marks its
// requests RunQueued, and while the queueing delay is over the target
// admission lets fewer of them through, the most critical first: here the
// delay is 60 times the target, and SHEDDABLE is refused while
// CRITICAL_PLUS is served.
func TestHTTPShedsWhatWaitedInTheRunQueue(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	ctl, err := admission.New(admission.WithClock(clk), admission.WithSaturation(nil)) // a saturated CPU
	if err != nil {
		t.Fatal(err)
	}
	mw, err := triagehttp.Middleware(triagehttp.WithAdmission(ctl), triagehttp.WithIntake(intake.WithClock(clk),
		intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}}))))
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
	// Ten SHEDDABLE and ten CRITICAL_PLUS requests an interval, served.
	traffic := func() (shed [criticality.NumLevels]int) {
		for range 10 {
			for _, l := range []criticality.Level{criticality.Sheddable, criticality.CriticalPlus} {
				if code, _ := get(l); code != 200 {
					shed[l]++
				}
			}
		}
		return shed
	}
	for range 5 {
		if shed := traffic(); shed != [criticality.NumLevels]int{} {
			t.Fatalf("no queue: shed %v", shed)
		}
		clk.Advance(admission.DefaultInterval)
	}
	// Work admitted elsewhere on the same controller (40 requests an
	// interval) waited 300 ms between arriving and starting, for three
	// intervals: the queueing delay the
	// controller measures (on the real clock, Go's run queue's).
	for range 3 {
		tks := make([]admission.Ticket, 40)
		for i := range tks {
			if err := ctl.Arrive(&tks[i], criticality.CriticalPlus, 0, time.Time{}, 0); err != nil {
				t.Fatal(err)
			}
		}
		clk.Advance(300 * time.Millisecond)
		for i := range tks {
			if err := ctl.Start(t.Context(), &tks[i]); err != nil {
				t.Fatal(err)
			}
			ctl.Done(&tks[i])
		}
		clk.Advance(admission.DefaultInterval)
		traffic()
	}
	code, body := get(criticality.Sheddable)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "queue") {
		t.Errorf("SHEDDABLE with the run queue 60x its target: %d %q, want 503 for the queue", code, body)
	}
	if code, body := get(criticality.CriticalPlus); code != 200 || body != "CRITICAL_PLUS" {
		t.Errorf("CRITICAL_PLUS with the run queue 60x its target: %d %q, want served", code, body)
	}
	// Shed from the bottom: SHEDDABLE entirely, CRITICAL_PLUS least (the
	// wait stayed 30 times the target, so the budget shrank into it).
	if s := ctl.Stats().QueueShed; s[criticality.Sheddable] != 1 || s[criticality.CriticalPlus] > 0.5 ||
		s[criticality.CriticalPlus] > s[criticality.Critical] || s[criticality.Critical] > s[criticality.SheddablePlus] {
		t.Errorf("QueueShed %v", s)
	}
}
