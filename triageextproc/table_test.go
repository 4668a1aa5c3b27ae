package triageextproc_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/conformance"
	"github.com/triagehq/triage/triageextproc"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/trust"
)

// The addresses the table's callers come from, as Envoy names them in
// source.address.
const (
	tableTrusted   = "127.0.0.2"
	tableUntrusted = "127.0.0.3"
)

// The conformance table (internal/testkit/conformance) through the
// processor, asked as Envoy's filter asks: each row's request through
// Envoy's stand-in, from the row's caller, to an HTTP upstream that
// believes only Envoy. The processor must refuse what the servers refuse,
// and the upstream's handler must see what theirs see. As through the
// sidecar, the client type and the caller's own triage keys stay with the
// processor, and a decay already spent is not forwarded; and over plain
// HTTP no deadline reaches the upstream (a request's deadline travels as
// grpc-timeout, for gRPC only), so a deadline is not compared either. A
// request with more headers than MaxHeaders is answered 431 (Envoy's own
// bound is lower).
func TestConformanceTableThroughTheProcessor(t *testing.T) {
	opts, ctl := conformance.Setup(t, tableTrusted)
	srv, err := triageextproc.New(append(opts, intake.WithAdmission(ctl))...)
	if err != nil {
		t.Fatal(err)
	}
	srv.HealthChecks = []string{"/grpc.health.v1.Health/Check"}
	srv.Group = func(header func(string) string) string { return header("x-plan") }
	base, _ := envoyFor(t, srv, "", nil)
	rec, upstream := tableUpstream(t)
	for _, row := range conformance.Rows {
		t.Run(row.Name, func(t *testing.T) {
			e := *base
			e.upstream, e.authority, e.peer = upstream, row.Host, tableUntrusted+":40000"
			if row.Trusted {
				e.peer = tableTrusted + ":40000"
			}
			h := http.Header{} // Envoy's header names are case-insensitive, as http.Header's canonical ones
			for _, kv := range row.Header {
				h.Add(kv[0], kv[1])
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a := e.do(ctx, "POST", row.Path, h, nil)
			if len(row.Header) > triageextproc.MaxHeaders {
				// Envoy answers 431 itself past its max_headers_count (100
				// by default), and the processor past MaxHeaders: the
				// request does not reach the upstream, where the servers
				// strip the keys and serve it.
				if a.status != http.StatusRequestHeaderFieldsTooLarge || a.upstreamSaw != nil {
					t.Errorf("%d headers: %d %s, want 431 and no upstream", len(row.Header), a.status, a.how)
				}
				return
			}
			var got conformance.Seen
			if oe, ok := triagehttp.FromResponse(&http.Response{StatusCode: a.status, Header: a.header}); ok {
				got.Outcome = oe.Kind
			} else if a.status != http.StatusOK || !strings.HasPrefix(a.how, "processed") {
				t.Fatalf("%s: %d %s", row.Path, a.status, a.how)
			} else {
				got = rec.Take()
				got.TriageKeys = nil
			}
			want := row.Want
			want.ClientType, want.TriageKeys, want.Deadline = "", nil, 0
			if want.DecayIn == 0 && want.DecayTo == want.Level.String() {
				want.DecayTo = ""
			}
			t.Logf("through the processor: %v", got)
			if got.String() != want.String() {
				t.Errorf("through the processor: %v\n want %v", got, want)
			}
		})
	}
}

// tableUpstream is an HTTP server on 127.0.0.1 that believes only
// Envoy's stand-in (its requests come from 127.0.0.1) and records what
// each request's handler sees.
func tableUpstream(t *testing.T) (*conformance.Recorder, string) {
	t.Helper()
	mw, err := triagehttp.Middleware(triagehttp.WithIntake(
		intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})),
		intake.WithClassifier(edge.MustNew(edge.Config{Rules: []edge.RuleConfig{{Header: true}}}))))
	if err != nil {
		t.Fatal(err)
	}
	rec := &conformance.Recorder{}
	hs := &http.Server{Handler: mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.Record(r.Context(), nil)
	}))}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go hs.Serve(lis)
	t.Cleanup(func() { hs.Close() })
	return rec, "http://" + lis.Addr().String()
}
