package triagehttp_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/trust"
)

// BenchmarkMiddleware measures the middleware's own work against a bare
// handler in the same run: /bare calls the handler directly. The handler
// writes a two-byte answer; under admission control (/trusted+admission)
// the write tells the request whether it waits on its client.
func BenchmarkMiddleware(b *testing.B) {
	ok := []byte("ok")
	var got criticality.Level
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = criticality.Of(r.Context())
		w.Write(ok)
	})
	rules := edge.MustNew(edge.Config{Rules: []edge.RuleConfig{{Header: true}, {PathPrefix: "/checkout", Criticality: "CRITICAL_PLUS"}}})
	mw, err := triagehttp.Middleware(triagehttp.WithClassifier(rules), triagehttp.WithTrust(trust.MustNew(trust.Config{Networks: []string{"10.0.0.0/8"}})))
	if err != nil {
		b.Fatal(err)
	}
	wrapped := mw(h)
	ctl, err := admission.New()
	if err != nil {
		b.Fatal(err)
	}
	mwAdm, err := triagehttp.Middleware(triagehttp.WithClassifier(rules), triagehttp.WithTrust(trust.MustNew(trust.Config{Networks: []string{"10.0.0.0/8"}})),
		triagehttp.WithAdmission(ctl))
	if err != nil {
		b.Fatal(err)
	}
	withAdmission := mwAdm(h)
	for _, tc := range []struct {
		name, remote, hdr string
		want              criticality.Level
		handler           http.Handler
	}{
		{"bare", "10.0.0.1:5", "SHEDDABLE", criticality.Sheddable, nil},
		{"trusted", "10.0.0.1:5", "SHEDDABLE", criticality.Sheddable, wrapped},
		{"untrusted-path-rule", "192.0.2.1:5", "", criticality.CriticalPlus, wrapped},
		{"trusted+admission", "10.0.0.1:5", "SHEDDABLE", criticality.Sheddable, withAdmission},
	} {
		r := httptest.NewRequest("GET", "/checkout/pay", nil)
		r.RemoteAddr = tc.remote
		if tc.hdr != "" {
			r.Header.Set("Triage-Criticality", tc.hdr)
		}
		w := httptest.NewRecorder()
		hh := tc.handler
		if hh == nil {
			hh = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				h.ServeHTTP(w, r.WithContext(criticality.NewContext(r.Context(), criticality.Sheddable)))
			})
		}
		hh.ServeHTTP(w, r)
		if got != tc.want {
			b.Fatalf("%s: got %v", tc.name, got)
		}
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				hh.ServeHTTP(w, r)
			}
		})
	}
}
