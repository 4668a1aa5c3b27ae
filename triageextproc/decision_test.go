package triageextproc_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/triageextproc"
	"github.com/triagehq/triage/trust"
)

// Envoy lets a request through unprocessed, with whatever triage headers
// its caller wrote, when the processor does not answer within
// message_timeout and failure_mode_allow is on (the documented config).
// A request that waits for a slot (here a CRITICAL gRPC call with 10 s
// left, the one slot held) must be answered before that: refused as
// task overloaded within the decision timeout (issue 55).
func TestEveryDecisionBeforeEnvoysTimeout(t *testing.T) {
	ctl, err := admission.New(admission.WithLimits(1, 1, 1), admission.WithMaxWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := triageextproc.New(intake.WithAdmission(ctl), intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})))
	if err != nil {
		t.Fatal(err)
	}
	srv.DecisionTimeout = 100 * time.Millisecond
	env, _ := envoyFor(t, srv, "127.0.0.1:50000", func() <-chan time.Time { return time.After(time.Second) }) // message_timeout 1 s
	env.failOpen = true
	cc := env.cc
	// A request admitted and not finished holds the one slot.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	holder, err := extprocv3.NewExternalProcessorClient(cc).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Send(env.requestHeaders("GET", "/hold", http.Header{}, true)); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Recv(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	a := env.do(context.Background(), "POST", "/pkg.Svc/Call", http.Header{"Content-Type": {"application/grpc"},
		"Grpc-Timeout": {"10S"}, "Triage-Criticality": {"CRITICAL"}}, nil)
	took := time.Since(start)
	if !strings.HasPrefix(a.how, "immediate") || a.upstreamSaw != nil {
		t.Errorf("a request waiting for a slot: %q after %v (upstream called: %v), want refused by the processor", a.how, took, a.upstreamSaw != nil)
	}
}

// A request with more headers than the processor reads is answered by
// the processor (431), not with a stream error that Envoy's fail-open
// would pass on unprocessed, triage headers and all (issue 55).
func TestTooManyHeadersAreRefusedNotPassedOn(t *testing.T) {
	srv, err := triageextproc.New()
	if err != nil {
		t.Fatal(err)
	}
	env, _ := envoyFor(t, srv, "192.0.2.7:40000", nil)
	env.failOpen = true
	h := http.Header{"Triage-Criticality": {"CRITICAL_PLUS"}}
	for i := range triageextproc.MaxHeaders + 1 {
		h.Set(fmt.Sprintf("X-Pad-%d", i), "x")
	}
	a := env.do(context.Background(), "GET", "/", h, nil)
	if !strings.HasPrefix(a.how, "immediate") || a.status != http.StatusRequestHeaderFieldsTooLarge || a.upstreamSaw != nil {
		t.Errorf("%d headers: %d %q (upstream called: %v), want 431 from the processor", len(h), a.status, a.how, a.upstreamSaw != nil)
	}
}

// envoyFor serves srv on loopback behind an echo upstream until the test
// ends, and returns Envoy's stand-in for it (failing closed; its
// message_timeout messageTimeout, nil: never) with a caller at peer, and
// a func that stops the processor early.
func envoyFor(t *testing.T, srv *triageextproc.Server, peer string, messageTimeout func() <-chan time.Time) (*envoy, func()) {
	t.Helper()
	addr, stop, err := listen(srv.Register)
	if err != nil {
		t.Fatal(err)
	}
	up := echoUpstream()
	cc, err := dialEnvoy(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close(); up.Close(); stop() })
	return &envoy{cc: cc, upstream: up.URL, peer: peer, timeout: messageTimeout}, stop
}
