package triagehttp_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/trust"
)

// FuzzFromResponse decodes arbitrary outcome and Retry-After headers.
func FuzzFromResponse(f *testing.F) {
	f.Add(503, "task-overloaded", "0")
	f.Add(429, "out-of-quota", "120")
	f.Add(503, "out-of-quota", "1")
	f.Add(200, "overloaded-dont-retry", "-5")
	f.Add(503, "overloaded-dont-retry", "Wed, 21 Oct 2015 07:28:00 GMT")
	f.Fuzz(func(t *testing.T, code int, tok, ra string) {
		resp := &http.Response{StatusCode: code, Header: http.Header{}}
		resp.Header.Set("Triage-Outcome", tok)
		resp.Header.Set("Retry-After", ra)
		oe, ok := triagehttp.FromResponse(resp)
		if !ok {
			return
		}
		if !oe.Kind.Overload() || triagehttp.StatusCode(oe.Kind) != code || oe.Kind.Token() != tok {
			t.Fatalf("decoded %+v from %d %q", oe, code, tok)
		}
		if oe.RetryAfter < 0 || oe.RetryAfter > outcome.MaxRetryAfter {
			t.Fatalf("RetryAfter %v", oe.RetryAfter)
		}
	})
}

// FuzzMiddlewareHeaders runs the middleware on arbitrary triage header
// values from a trusted and from an untrusted peer.
func FuzzMiddlewareHeaders(f *testing.F) {
	f.Add("CRITICAL_PLUS", "2", "", "10.0.0.1:5")
	f.Add("sheddable", "x", "SHEDDABLE", "127.0.0.1:9")
	f.Add("\x00", "99999", "", "garbage")
	pol := trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})
	mw, err := triagehttp.Middleware(triagehttp.WithIntake(intake.WithTrust(pol)))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, crit, att, second, remote string) {
		var got criticality.Level
		var n int
		var leaked bool
		h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got, n = criticality.Of(r.Context()), attempt.Incoming(r.Context())
			leaked = len(r.Header.Values("Triage-Criticality")) > 0
		}))
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		r.Header["Triage-Criticality"] = []string{crit}
		if second != "" {
			r.Header["Triage-Criticality"] = append(r.Header["Triage-Criticality"], second)
		}
		r.Header["Triage-Attempt"] = []string{att}
		h.ServeHTTP(httptest.NewRecorder(), r)
		trusted := pol.Trusted(triagehttp.PeerOf(r))
		if !got.Valid() || n < 0 || n > attempt.MaxAttempts {
			t.Fatalf("got %v / %d", got, n)
		}
		if !trusted && (got != criticality.Default || n != 0 || leaked) {
			t.Fatalf("untrusted peer %q set %v/%d (leaked=%v)", remote, got, n, leaked)
		}
		if trusted && second == "" {
			want, err := criticality.Parse(crit)
			if err != nil {
				want = criticality.Default
			}
			if got != want {
				t.Fatalf("trusted %q gave %v", crit, got)
			}
		}
	})
}
