package triagehttp_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/outcome"
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
	mw, err := triagehttp.Middleware(triagehttp.WithIntake(intake.WithClassifier(rules), intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"10.0.0.0/8"}}))))
	if err != nil {
		b.Fatal(err)
	}
	wrapped := mw(h)
	ctl, err := admission.New()
	if err != nil {
		b.Fatal(err)
	}
	mwAdm, err := triagehttp.Middleware(triagehttp.WithIntake(intake.WithClassifier(rules), intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"10.0.0.0/8"}}))),
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
		{"trusted+admission/net-http-writer", "10.0.0.1:5", "SHEDDABLE", criticality.Sheddable, withAdmission},
	} {
		r := httptest.NewRequest("GET", "/checkout/pay", nil)
		r.RemoteAddr = tc.remote
		if tc.hdr != "" {
			r.Header.Set("Triage-Criticality", tc.hdr)
		}
		var w http.ResponseWriter = httptest.NewRecorder()
		if strings.HasSuffix(tc.name, "net-http-writer") {
			w = http1ShapedWriter{w.(*httptest.ResponseRecorder)}
		}
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

// http1ShapedWriter has the methods of net/http's HTTP/1.x writer, as a
// server hands it to the middleware (the recorder alone is a Flusher and
// nothing more, which takes the general path).
type http1ShapedWriter struct{ *httptest.ResponseRecorder }

func (http1ShapedWriter) FlushError() error                            { return nil }
func (http1ShapedWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) { return nil, nil, nil }
func (w http1ShapedWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(w.ResponseRecorder, r)
}
func (http1ShapedWriter) CloseNotify() <-chan bool         { return nil }
func (http1ShapedWriter) SetReadDeadline(time.Time) error  { return nil }
func (http1ShapedWriter) SetWriteDeadline(time.Time) error { return nil }
func (http1ShapedWriter) EnableFullDuplex() error          { return nil }

// discardWriter is a ResponseWriter that keeps one header map, cleared
// for each answer, and drops the body: what WriteError itself costs. It
// writes strings as net/http's writer does, without a copy.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header               { return w.h }
func (w *discardWriter) Write(b []byte) (int, error)       { return len(b), nil }
func (w *discardWriter) WriteString(s string) (int, error) { return len(s), nil }
func (w *discardWriter) WriteHeader(int)                   {}

// BenchmarkWriteError is a refusal's answer: the outcome and Retry-After
// headers, the content headers and the message.
func BenchmarkWriteError(b *testing.B) {
	err := &outcome.Error{Kind: outcome.TaskOverloaded, Reason: "queue", RetryAfter: 2 * time.Second}
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		if !triagehttp.WriteError(w, err) {
			b.Fatal("not written")
		}
	}
}
