package triageotel_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triageotel"
	"github.com/triagehq/triage/trust"
)

// tier serves relay tier t with triage (admission ctl, loopback trusted,
// tr's tracer) and otelgrpc's server handler on loopback.
func tier(t *testing.T, tp trace.TracerProvider, tr *triageotel.Tracer, ctl *admission.Controller, rt *relay.Tier) string {
	t.Helper()
	srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithAdmission(ctl), intake.WithTracer(tr.Intake()),
		intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}}))))
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(append(srv.ServerOptions(),
		grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(propagation.TraceContext{}))))...)
	relay.Register(gs, rt)
	return loopback.ServeGRPC(t, gs)
}

// The drill's stack in small: a frontend tier calls a backend through
// triage's gRPC client (throttle, retries and their budget, with the
// tracer), every hop with otelgrpc. While a request holds the backend's
// only slot, a CRITICAL user request waits for it and is admitted: its
// trace runs from the user's span through the frontend to the backend's
// server span, which says how long it queued. A SHEDDABLE one, which the
// backend sheds at arrival, is refused there in a span of triage's under
// the frontend's client span, once per attempt, and the frontend's span
// records the retries and the give-up. With TRIAGE_TRACE_OUT, the SDK's
// stdout exporter writes the spans.
func TestStackTrace(t *testing.T) {
	tp, rec := tracing(t)
	tr, err := triageotel.NewTracer(tp)
	if err != nil {
		t.Fatal(err)
	}
	limits := func(n int) *admission.Controller {
		ctl, err := admission.New(admission.WithLimits(n, n, n), admission.WithQueueFactor(1), admission.WithMaxWait(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		return ctl
	}
	release := make(chan struct{})
	backendCtl := limits(1)
	backend := tier(t, tp, tr, backendCtl, &relay.Tier{Name: "backend", Fail: func(_ context.Context, body string) error {
		if body == "hold" {
			<-release
		}
		return nil
	}})
	policy, err := retry.New(retry.WithTracer(tr.Client()), retry.WithBackoff(time.Millisecond, 2*time.Millisecond), retry.WithoutThrottle())
	if err != nil {
		t.Fatal(err)
	}
	client := loopback.Client(t, egress.WithPolicy(policy))
	next := loopback.DialGRPC(t, backend, append(client.DialOptions(),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(propagation.TraceContext{}))))...)
	frontend := tier(t, tp, tr, limits(8), &relay.Tier{Name: "frontend", Next: next})
	users := loopback.DialGRPC(t, frontend,
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(propagation.TraceContext{}))))
	direct := loopback.DialGRPC(t, backend)
	user := tp.Tracer("user")
	call := func(name string, cc *grpc.ClientConn, l criticality.Level, body string) (trace.SpanContext, error) {
		ctx, span := user.Start(context.Background(), name)
		defer span.End()
		ctx = metadata.AppendToOutgoingContext(ctx, "triage-criticality", l.String())
		_, err := relay.Invoke(ctx, cc, body)
		return span.SpanContext(), err
	}

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _, _ = call("holder", direct, criticality.Critical, "hold") }()
	loopback.WaitFor(t, "the holder's slot", func() bool { return backendCtl.Stats().Executing == 1 })
	var waited trace.SpanContext
	go func() {
		defer wg.Done()
		var err error
		if waited, err = call("critical user request", users, criticality.Critical, "x"); err != nil {
			t.Errorf("the CRITICAL request: %v", err)
		}
	}()
	loopback.WaitFor(t, "the CRITICAL request in the backend's queue", func() bool { return backendCtl.Stats().Queued == 1 })
	if err := backendCtl.ForceShed(criticality.Sheddable, 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	shed, err := call("sheddable user request", users, criticality.Sheddable, "y")
	if err == nil {
		t.Fatal("the SHEDDABLE request was answered")
	}
	close(release)
	wg.Wait()
	// otelgrpc ends a server span in its handler's End, which can run after
	// the caller has its answer: wait until every span started has ended.
	loopback.WaitFor(t, "every span ended", func() bool { return len(rec.Ended()) == len(rec.Started()) })
	tp.ForceFlush(context.Background())

	byTrace := map[trace.TraceID][]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byTrace[s.SpanContext().TraceID()] = append(byTrace[s.SpanContext().TraceID()], s)
	}
	// The CRITICAL request: user -> frontend client, server -> backend
	// client, server; the backend's server span has the wait.
	var waits []float64
	servers := 0
	for _, s := range byTrace[waited.TraceID()] {
		if s.SpanKind() == trace.SpanKindServer {
			servers++
		}
		if e, ok := event(s, triageotel.EventAdmitted); ok {
			waits = append(waits, floatAttr(e.Attributes, "triage.wait"))
		}
	}
	if servers != 2 || len(waits) != 1 || waits[0] <= 0 {
		t.Errorf("the CRITICAL request's trace: %d server spans, waits %v; want 2 and one wait > 0", servers, waits)
	}
	// The SHEDDABLE request: the backend's refusals in the user's trace,
	// one per attempt, and the frontend's retries and give-up.
	refusals, retries, exhausted := 0, 0, 0
	for _, s := range byTrace[shed.TraceID()] {
		if _, ok := event(s, triageotel.EventRefused); ok {
			refusals++
		}
		for _, e := range s.Events() {
			switch e.Name {
			case triageotel.EventRetried:
				retries++
			case triageotel.EventExhausted:
				exhausted++
			}
		}
	}
	if refusals != retry.DefaultMaxAttempts || retries != retry.DefaultMaxAttempts-1 || exhausted != 1 {
		t.Errorf("the SHEDDABLE request's trace: %d refusals, %d retries, %d give-ups; want %d, %d, 1",
			refusals, retries, exhausted, retry.DefaultMaxAttempts, retry.DefaultMaxAttempts-1)
	}
}
