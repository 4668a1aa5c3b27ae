package triageextproc_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/triageextproc"
	"github.com/triagehq/triage/trust"
)

// rig is a processor on loopback with admission limited to one request
// at a time, SHEDDABLE force-shed, and 127.0.0.1 trusted; an echo
// upstream; and an Envoy stand-in in front.
type rig struct {
	ctl  *admission.Controller
	env  *envoy
	stop func()
}

func newRig(t *testing.T) *rig {
	t.Helper()
	ctl, err := admission.New(admission.WithLimits(1, 1, 1), admission.WithQueueFactor(0), admission.WithMaxWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.ForceShed(criticality.Sheddable, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	cl, err := edge.New(edge.Config{Default: "SHEDDABLE_PLUS", Rules: []edge.RuleConfig{{Header: true}, {PathPrefix: "/checkout", Criticality: "CRITICAL_PLUS"}}})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := triageextproc.New(intake.WithAdmission(ctl), intake.WithClassifier(cl),
		intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})))
	if err != nil {
		t.Fatal(err)
	}
	env, stop := envoyFor(t, srv, "127.0.0.1:50000", nil)
	return &rig{ctl: ctl, env: env, stop: stop}
}

// row is one line of the conformance table.
type row struct {
	sequence, processor, envoy string
}

// TestConformance drives the processor as Envoy's ext_proc filter does
// and checks, for each sequence of messages, what the processor answers
// and what Envoy then does with the request. The table is logged (go
// test -v -run TestConformance ./triageextproc).
func TestConformance(t *testing.T) {
	var table []row
	record := func(seq, proc string, a answer) {
		table = append(table, row{seq, proc, fmt.Sprintf("%d, %s", a.status, a.how)})
	}
	ctx := context.Background()

	t.Run("headers only, trusted peer", func(t *testing.T) {
		r := newRig(t)
		a := r.env.do(ctx, "GET", "/search?q=1", http.Header{"Triage-Criticality": {"CRITICAL"}, "Triage-Attempt": {"1"}}, nil)
		if a.status != 200 || a.how != "processed" || a.upstreamSaw.Get("Seen") != "triage-attempt=1 triage-criticality=CRITICAL" {
			t.Fatalf("got %d %q, upstream saw %q", a.status, a.how, a.upstreamSaw.Get("Seen"))
		}
		if s := r.ctl.Stats(); s.Executing != 0 {
			t.Errorf("after the response phase: %d executing, want 0", s.Executing)
		}
		record("request headers (GET), response headers; trusted peer sends CRITICAL, attempt 1", "continue: triage-criticality CRITICAL, triage-attempt 1", a)
	})

	t.Run("untrusted peer", func(t *testing.T) {
		r := newRig(t)
		r.env.peer = "192.0.2.7:40000"
		a := r.env.do(ctx, "GET", "/checkout/pay", http.Header{"Triage-Criticality": {"SHEDDABLE"}, "Triage-Customer": {"mallory"}}, nil)
		if a.status != 200 || a.upstreamSaw.Get("Seen") != "triage-criticality=CRITICAL_PLUS" {
			t.Fatalf("got %d %q, upstream saw %q", a.status, a.how, a.upstreamSaw.Get("Seen"))
		}
		record("request headers from an untrusted peer claiming SHEDDABLE and a customer, path /checkout", "continue: its triage headers removed, CRITICAL_PLUS by the path rule", a)
	})

	t.Run("percent-encoded path", func(t *testing.T) {
		r := newRig(t)
		r.env.peer = "192.0.2.7:40000"
		for _, p := range []string{"/checkout/%2e%2e/search", "/checkout/%2E%2E/search?q=1", "/checkout%2f..%2fsearch"} {
			a := r.env.do(ctx, "GET", p, http.Header{}, nil)
			if a.status != 200 || a.upstreamSaw.Get("Seen") != "triage-criticality=SHEDDABLE_PLUS" {
				t.Fatalf("%s: got %d %q, upstream saw %q", p, a.status, a.how, a.upstreamSaw.Get("Seen"))
			}
		}
		record("request headers with :path /checkout/%2e%2e/search (the upstream decodes it to /search)", "continue: matched as /search, not under /checkout: SHEDDABLE_PLUS", r.env.do(ctx, "GET", "/checkout/%2e%2e/search", http.Header{}, nil))
	})

	t.Run("no source.address", func(t *testing.T) {
		r := newRig(t)
		r.env.noAttribute = true
		a := r.env.do(ctx, "GET", "/", http.Header{"Triage-Criticality": {"CRITICAL_PLUS"}}, nil)
		if a.status != 200 || a.upstreamSaw.Get("Seen") != "triage-criticality=SHEDDABLE_PLUS" {
			t.Fatalf("got %d %q, upstream saw %q", a.status, a.how, a.upstreamSaw.Get("Seen"))
		}
		record("request headers without the source.address attribute, claiming CRITICAL_PLUS", "continue: unknown peer, claim removed, default SHEDDABLE_PLUS", a)
	})

	t.Run("with body", func(t *testing.T) {
		r := newRig(t)
		r.env.bufferBody = true
		a := r.env.do(ctx, "POST", "/orders", http.Header{"Triage-Criticality": {"CRITICAL"}}, []byte("order-1"))
		if a.status != 200 || a.upstreamBody != "order-1" {
			t.Fatalf("got %d %q, upstream body %q", a.status, a.how, a.upstreamBody)
		}
		record("request headers, request body (BUFFERED), response headers", "continue; body answered unchanged", a)
	})

	t.Run("refused", func(t *testing.T) {
		r := newRig(t)
		a := r.env.do(ctx, "GET", "/", http.Header{"Triage-Criticality": {"SHEDDABLE"}}, nil)
		if a.status != 503 || a.upstreamSaw != nil || a.header.Get("Triage-Outcome") != "task-overloaded" || a.header.Get("Retry-After") == "" {
			t.Fatalf("got %d %q %v", a.status, a.how, a.header)
		}
		record("request headers, SHEDDABLE while admission sheds it", "immediate response 503, triage-outcome task-overloaded, retry-after", a)
	})

	t.Run("refused gRPC", func(t *testing.T) {
		r := newRig(t)
		a := r.env.do(ctx, "POST", "/pkg.Svc/M", http.Header{"Triage-Criticality": {"SHEDDABLE"}, "Content-Type": {"application/grpc"}, "Grpc-Timeout": {"500m"}}, nil)
		if a.status != 200 || a.header.Get("Grpc-Status") != "14" || !strings.HasPrefix(a.header.Get("Grpc-Message"), "triage: task overloaded") {
			t.Fatalf("got %d %q %v", a.status, a.how, a.header)
		}
		record("gRPC request headers, SHEDDABLE while admission sheds it", "immediate response, grpc_status 14 (UNAVAILABLE), triage's message", a)
	})

	t.Run("client cancel while waiting", func(t *testing.T) {
		r := newRig(t)
		hold := r.hold(t)
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan answer, 1)
		go func() { done <- r.env.do(cctx, "GET", "/", http.Header{"Triage-Criticality": {"CRITICAL"}}, nil) }()
		loopback.WaitFor(t, "the second request queued", func() bool { return r.ctl.Stats().Queued == 1 })
		cancel()
		a := <-done
		loopback.WaitFor(t, "the queue empty after the reset", func() bool { return r.ctl.Stats().Queued == 0 })
		hold()
		if a.upstreamSaw != nil {
			t.Fatalf("a reset request reached the upstream: %+v", a)
		}
		table = append(table, row{"request headers, then the client goes away while the request waits for a slot (Envoy resets the stream)", "stops waiting, leaves the queue; nothing to answer", "nothing: the client is gone"})
	})

	t.Run("processor slow, fail closed", func(t *testing.T) {
		r := newRig(t)
		hold := r.hold(t)
		timedOut := make(chan time.Time)
		r.env.timeout = func() <-chan time.Time { return timedOut }
		done := make(chan answer, 1)
		go func() { done <- r.env.do(ctx, "GET", "/", http.Header{"Triage-Criticality": {"CRITICAL"}}, nil) }()
		loopback.WaitFor(t, "the request queued", func() bool { return r.ctl.Stats().Queued == 1 })
		close(timedOut)
		a := <-done
		loopback.WaitFor(t, "the queue empty after the reset", func() bool { return r.ctl.Stats().Queued == 0 })
		hold()
		if a.status != 504 || a.upstreamSaw != nil {
			t.Fatalf("got %d %q", a.status, a.how)
		}
		record("request headers; the request waits for a slot past message_timeout (failure_mode_allow false)", "still waiting; leaves the queue when Envoy resets the stream", a)
	})

	t.Run("processor slow, fail open", func(t *testing.T) {
		r := newRig(t)
		hold := r.hold(t)
		timedOut := make(chan time.Time)
		r.env.timeout = func() <-chan time.Time { return timedOut }
		r.env.failOpen = true
		done := make(chan answer, 1)
		go func() { done <- r.env.do(ctx, "GET", "/", http.Header{"Triage-Criticality": {"CRITICAL"}}, nil) }()
		loopback.WaitFor(t, "the request queued", func() bool { return r.ctl.Stats().Queued == 1 })
		close(timedOut)
		a := <-done
		hold()
		if a.status != 200 || !strings.HasPrefix(a.how, "unprocessed") || a.upstreamSaw.Get("Seen") != "triage-criticality=CRITICAL" {
			t.Fatalf("got %d %q, upstream saw %q", a.status, a.how, a.upstreamSaw.Get("Seen"))
		}
		record("the same, failure_mode_allow true", "still waiting; leaves the queue when Envoy resets the stream", a)
	})

	t.Run("processor gone", func(t *testing.T) {
		for _, open := range []bool{false, true} {
			r := newRig(t)
			r.gone(t)
			r.env.failOpen = open
			a := r.env.do(ctx, "GET", "/", http.Header{"Triage-Criticality": {"SHEDDABLE"}}, nil)
			want := 500
			if open {
				want = 200
			}
			if a.status != want {
				t.Fatalf("failure_mode_allow %v: got %d %q, want %d", open, a.status, a.how, want)
			}
			record(fmt.Sprintf("processor unreachable, failure_mode_allow %v", open), "-", a)
		}
	})

	var b strings.Builder
	b.WriteString("\n| sequence | the processor | Envoy, then |\n|---|---|---|\n")
	for _, r := range table {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", r.sequence, r.processor, r.envoy)
	}
	t.Log(b.String())
}

// hold takes the rig's one execution slot with a request that stays in
// its upstream phase until the returned func is called.
func (r *rig) hold(t *testing.T) (release func()) {
	t.Helper()
	stream, err := extprocEnvoyStream(r.env)
	if err != nil {
		t.Fatal(err)
	}
	loopback.WaitFor(t, "the holding request admitted", func() bool { return r.ctl.Stats().Executing == 1 })
	return func() { stream.CloseSend(); stream.Recv() }
}

// gone stops the rig's processor and points its Envoy at an address
// nobody listens on.
func (r *rig) gone(t *testing.T) {
	t.Helper()
	r.stop()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	cc, err := dialEnvoy(dead)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	r.env.cc = cc
}
