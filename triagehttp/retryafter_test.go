package triagehttp_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/trust"
)

// everything is a Signal past every threshold.
type everything struct{}

func (everything) Name() string         { return "everything" }
func (everything) Utilization() float64 { return 2 }

// Over loopback: once a task has shed SHEDDABLE for a while, its 503s say
// Retry-After with the grown delay (in whole seconds, rounded up); a
// CRITICAL rejection says 0.
func TestSheddableRejectionsSayRetryAfter(t *testing.T) {
	f := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	ctl, err := admission.New(admission.WithClock(f), admission.WithSignal(everything{}, admission.DefaultThresholds()))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := triagehttp.Middleware(triagehttp.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32", "::1/128"}}))), triagehttp.WithAdmission(ctl))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	defer srv.Close()
	get := func(level string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL, nil)
		req.Header.Set("Triage-Criticality", level)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s: status %d, want 503", level, resp.StatusCode)
		}
		return resp
	}
	for range 9 {
		get("SHEDDABLE")
		f.Advance(500 * time.Millisecond)
	}
	ra, err := strconv.Atoi(get("SHEDDABLE").Header.Get("Retry-After"))
	if err != nil || ra < 3 || ra > 4 {
		t.Fatalf("after 4.5 s of shedding: Retry-After %d (%v), want 3 or 4", ra, err)
	}
	if ra := get("CRITICAL").Header.Get("Retry-After"); ra != "0" {
		t.Fatalf("CRITICAL: Retry-After %q, want 0", ra)
	}
}
