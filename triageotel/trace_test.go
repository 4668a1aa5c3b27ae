package triageotel_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triageotel"
	"github.com/triagehq/triage/trust"
)

// tracing is a TracerProvider whose spans a SpanRecorder keeps, and with
// TRIAGE_TRACE_OUT set, the SDK's stdout exporter writes to that file.
func tracing(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	opts := []sdktrace.TracerProviderOption{sdktrace.WithSpanProcessor(rec)}
	if path := os.Getenv("TRIAGE_TRACE_OUT"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		exp, err := stdouttrace.New(stdouttrace.WithWriter(f), stdouttrace.WithPrettyPrint())
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, sdktrace.WithSyncer(exp))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp, rec
}

func event(s sdktrace.ReadOnlySpan, name string) (sdktrace.Event, bool) {
	for _, e := range s.Events() {
		if e.Name == name {
			return e, true
		}
	}
	return sdktrace.Event{}, false
}

// A gRPC server with otelgrpc's stats handler and triage's tracer, over
// loopback, with one execution slot and room for one waiting request.
// While a CRITICAL request holds the slot: a second CRITICAL request
// waits for it, and is admitted after the wait, recorded on otelgrpc's
// server span; a SHEDDABLE request, shed at arrival (a ForceShed drill),, refused in the tap before grpc-go
// starts any span, gets a server span of triage's, child of the caller's
// trace, with the refusal; the caller's client-side policy retries it and
// records each retry and the give-up on the caller's span.
func TestSpansRecordDecisions(t *testing.T) {
	tp, rec := tracing(t)
	tr, err := triageotel.NewTracer(tp, triageotel.WithCustomer())
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := admission.New(admission.WithLimits(1, 1, 1), admission.WithQueueFactor(1), admission.WithMaxWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithAdmission(ctl), intake.WithTracer(tr.Intake()),
		intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}}))))
	if err != nil {
		t.Fatal(err)
	}
	prop := propagation.TraceContext{}
	release := make(chan struct{})
	gs := grpc.NewServer(append(srv.ServerOptions(),
		grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(prop))))...)
	relay.Register(gs, &relay.Tier{Name: "backend", Fail: func(_ context.Context, body string) error {
		if body == "hold" {
			<-release
		}
		return nil
	}})
	cc := loopback.DialGRPC(t, loopback.ServeGRPC(t, gs),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(prop))))
	call := func(ctx context.Context, l criticality.Level, body string) error {
		ctx = metadata.AppendToOutgoingContext(ctx, "triage-criticality", l.String(), "triage-customer", "shop")
		_, err := relay.Invoke(ctx, cc, body)
		return err
	}
	caller := tp.Tracer("caller")
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = call(context.Background(), criticality.Critical, "hold") }()
	loopback.WaitFor(t, "the holder's slot", func() bool { return ctl.Stats().Executing == 1 })
	waitCtx, waiting := caller.Start(context.Background(), "waits")
	go func() {
		defer wg.Done()
		if err := call(waitCtx, criticality.Critical, "wait"); err != nil {
			t.Errorf("the waiting request: %v", err)
		}
		waiting.End()
	}()
	loopback.WaitFor(t, "the second request in the queue", func() bool { return ctl.Stats().Queued == 1 })
	// The task sheds SHEDDABLE requests at arrival (a drill: the same
	// refusal in the tap as under load).
	if err := ctl.ForceShed(criticality.Sheddable, 1, time.Minute); err != nil {
		t.Fatal(err)
	}

	policy, err := retry.New(retry.WithTracer(tr.Client()), retry.WithBackoff(time.Millisecond, 2*time.Millisecond), retry.WithoutThrottle())
	if err != nil {
		t.Fatal(err)
	}
	refCtx, refused := caller.Start(criticality.NewContext(context.Background(), criticality.Sheddable), "refused")
	err = policy.Do(refCtx, func(ctx context.Context) error {
		err := call(ctx, criticality.Sheddable, "shed")
		if st, ok := status.FromError(err); ok {
			if oe, ok := triagegrpc.FromStatus(st); ok {
				return oe
			}
		}
		return err
	})
	refused.End()
	if err == nil {
		t.Fatal("the SHEDDABLE request was not refused")
	}
	close(release)
	wg.Wait()
	// otelgrpc ends a server span in its handler's End, which can run after
	// the caller has its answer: wait until every span started has ended.
	loopback.WaitFor(t, "every span ended", func() bool { return len(rec.Ended()) == len(rec.Started()) })
	tp.ForceFlush(context.Background())

	spans := rec.Ended()
	byParent := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	var waitSpan, refSpan sdktrace.ReadOnlySpan
	for _, s := range spans {
		byParent[s.Parent().SpanID()] = append(byParent[s.Parent().SpanID()], s)
		switch s.Name() {
		case "waits":
			waitSpan = s
		case "refused":
			refSpan = s
		}
	}
	// The waiting request: caller span -> client span -> server span.
	server := serverSpans(byParent, waitSpan.SpanContext().SpanID())
	if len(server) != 1 {
		t.Fatalf("%d server spans under the waiting request, want 1", len(server))
	}
	ev, ok := event(server[0], triageotel.EventAdmitted)
	if !ok {
		t.Fatalf("no %s event on the server span: %v", triageotel.EventAdmitted, server[0].Events())
	}
	if w := floatAttr(ev.Attributes, "triage.wait"); w <= 0 {
		t.Errorf("admitted after a wait of %v s", w)
	}
	if c := stringAttr(server[0].Attributes(), "triage.criticality"); c != "CRITICAL" {
		t.Errorf("criticality %q on the span", c)
	}
	if c := stringAttr(server[0].Attributes(), "triage.customer"); c != "shop" {
		t.Errorf("customer %q on the span (WithCustomer)", c)
	}
	// Only the request that queued has the event: the holder took its
	// slot at once.
	admitted := 0
	for _, s := range spans {
		if _, ok := event(s, triageotel.EventAdmitted); ok {
			admitted++
		}
	}
	if admitted != 1 {
		t.Errorf("%d spans with %s, want 1 (the request that waited)", admitted, triageotel.EventAdmitted)
	}
	// The refused request: three attempts, each a client span with a
	// server span of triage's under it, refused.
	refusals := serverSpans(byParent, refSpan.SpanContext().SpanID())
	if len(refusals) != retry.DefaultMaxAttempts {
		t.Fatalf("%d refused server spans, want one per attempt (%d)", len(refusals), retry.DefaultMaxAttempts)
	}
	for _, s := range refusals {
		ev, ok := event(s, triageotel.EventRefused)
		if !ok || s.Status().Code != 1 /* codes.Error */ || s.SpanKind() != trace.SpanKindServer {
			t.Fatalf("refused span %q: events %v, status %v, kind %v", s.Name(), s.Events(), s.Status(), s.SpanKind())
		}
		if r := stringAttr(ev.Attributes, "triage.reason"); r != "forced" {
			t.Errorf("refused for %q, want forced", r)
		}
		if s.SpanContext().TraceID() != refSpan.SpanContext().TraceID() {
			t.Error("the refusal's span is not in the caller's trace")
		}
	}
	var retried, exhausted int
	for _, e := range refSpan.Events() {
		switch e.Name {
		case triageotel.EventRetried:
			retried++
		case triageotel.EventExhausted:
			exhausted++
		}
	}
	if retried != retry.DefaultMaxAttempts-1 || exhausted != 1 {
		t.Errorf("caller's span: %d retries and %d give-ups, want %d and 1: %v", retried, exhausted, retry.DefaultMaxAttempts-1, refSpan.Events())
	}
}

// serverSpans returns the server spans two levels under parent (the
// client span of each attempt, then the server's).
func serverSpans(byParent map[trace.SpanID][]sdktrace.ReadOnlySpan, parent trace.SpanID) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, c := range byParent[parent] {
		for _, s := range byParent[c.SpanContext().SpanID()] {
			if s.SpanKind() == trace.SpanKindServer {
				out = append(out, s)
			}
		}
	}
	return out
}

func stringAttr(kvs []attribute.KeyValue, key string) string {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

func floatAttr(kvs []attribute.KeyValue, key string) float64 {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return kv.Value.AsFloat64()
		}
	}
	return 0
}

// A request refused before any span exists gets a span named by its gRPC
// method (bounded), or "triage.refused" for HTTP: a path a caller chooses
// would give every URL a span name of its own.
func TestRefusedSpanNames(t *testing.T) {
	tp, rec := tracing(t)
	tr, err := triageotel.NewTracer(tp)
	if err != nil {
		t.Fatal(err)
	}
	long := "/pkg.Svc/" + strings.Repeat("x", 500)
	for _, e := range []intake.Event{
		{Kind: intake.Refused, Path: "/pkg.Svc/Call", Case: intake.LowerCase, Header: map[string][]string{}, Err: errors.New("refused")},
		{Kind: intake.Refused, Path: long, Case: intake.LowerCase, Header: map[string][]string{}, Err: errors.New("refused")},
		{Kind: intake.Refused, Path: "/users/4711/orders", Case: intake.Canonical, Header: map[string][]string{}, Err: errors.New("refused")},
	} {
		tr.Intake().Trace(context.Background(), &e)
	}
	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
	}
	want := []string{"pkg.Svc/Call", long[1:128], "triage.refused"}
	if strings.Join(names, "|") != strings.Join(want, "|") {
		t.Errorf("span names %q, want %q", names, want)
	}
}
