package triageotel

import (
	"context"
	"errors"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/retry"
)

// Span event names.
const (
	EventAdmitted      = "triage.admitted"        // triage.wait: seconds waited for an execution slot
	EventRefused       = "triage.refused"         // triage.outcome, triage.reason, triage.dont_retry
	EventCharged       = "triage.quota.charged"   // triage.cpu: CPU-seconds charged
	EventThrottled     = "triage.throttled"       // client: rejected locally, not sent
	EventRetried       = "triage.retry"           // triage.attempt, triage.backoff (seconds)
	EventBudgetRefused = "triage.retry.refused"   // the retry budget refused a retry
	EventExhausted     = "triage.retry.exhausted" // every attempt was rejected as overloaded
)

// Span attribute keys: namespaced, as OpenTelemetry's conventions ask of
// a span's attributes (a metric's attributes are the Prometheus labels'
// names, so that its series translate to triageprom's).
const (
	spanCriticality = attribute.Key("triage.criticality")
	spanAttempt     = attribute.Key("triage.attempt")
	spanTrusted     = attribute.Key("triage.trusted")
	spanCustomer    = attribute.Key("triage.customer")
	spanReason      = attribute.Key("triage.reason")
)

// Tracer records triage's decisions on requests' spans: as attributes
// triage.criticality, triage.attempt, triage.client_type and, with
// WithCustomer, triage.customer; and as the events named Event*. It
// records on the span in the context it is given, and for a request
// refused before any span exists (grpc-go runs its stats handlers, and
// so otelgrpc's server span, after the tap where triage refuses) it
// starts a server span of its own, child of the trace context the request
// carries, ended at once with an error status.
//
// Create one with NewTracer; it is safe for concurrent use and keeps no
// state per request. Give Intake to the server adapter
// (intake.WithTracer, given to triagegrpc.WithIntake or triagehttp.WithIntake) and Client to
// retry.WithTracer.
type Tracer struct {
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	customer bool
}

// TracerOption configures a Tracer.
type TracerOption interface{ apply(*Tracer) }

type tracerOption func(*Tracer)

func (f tracerOption) apply(t *Tracer) { f(t) }

// WithCustomer records the request's customer (triage.customer). Default:
// not recorded, as a customer's name can be personal data.
func WithCustomer() TracerOption { return tracerOption(func(t *Tracer) { t.customer = true }) }

// WithPropagator sets how the trace context of a request refused before
// any span exists is read from its header. Default: W3C Trace Context
// (propagation.TraceContext).
func WithPropagator(p propagation.TextMapPropagator) TracerOption {
	return tracerOption(func(t *Tracer) { t.prop = p })
}

// NewTracer returns a Tracer whose spans come from tp's tracer for this
// package.
func NewTracer(tp trace.TracerProvider, opts ...TracerOption) (*Tracer, error) {
	if tp == nil {
		return nil, errors.New("triageotel: a nil TracerProvider")
	}
	t := &Tracer{tracer: tp.Tracer(scope), prop: propagation.TraceContext{}}
	for _, o := range opts {
		o.apply(t)
	}
	if t.prop == nil {
		return nil, errors.New("triageotel: a nil propagator")
	}
	return t, nil
}

// Intake returns the tracer to give a server adapter (intake.Tracer).
func (t *Tracer) Intake() intake.Tracer { return intakeTracer{t} }

// Client returns the tracer to give retry.WithTracer.
func (t *Tracer) Client() retry.Tracer { return clientTracer{t} }

type intakeTracer struct{ t *Tracer }

// Trace implements intake.Tracer.
func (it intakeTracer) Trace(ctx context.Context, e *intake.Event) {
	t := it.t
	span := trace.SpanFromContext(ctx)
	own := false
	if !span.IsRecording() {
		if e.Kind != intake.Refused || e.Header == nil {
			return
		}
		parent := t.prop.Extract(ctx, headerCarrier{h: e.Header, canonical: e.Case == intake.Canonical})
		_, span = t.tracer.Start(parent, spanName(e), trace.WithSpanKind(trace.SpanKindServer))
		own = true
	}
	span.SetAttributes(t.requestAttributes(e)...)
	switch e.Kind {
	case intake.Admitted:
		if e.Wait > 0 {
			span.AddEvent(EventAdmitted, trace.WithAttributes(attribute.Float64("triage.wait", e.Wait.Seconds())))
		}
	case intake.Refused:
		span.AddEvent(EventRefused, trace.WithAttributes(refusalAttributes(e)...))
		if own {
			span.SetStatus(codes.Error, e.Err.Error())
			span.End()
		}
	case intake.Charged:
		span.AddEvent(EventCharged, trace.WithAttributes(attribute.Float64("triage.cpu", e.CPU.Seconds())))
	}
}

// requestAttributes are what was decided about the request.
func (t *Tracer) requestAttributes(e *intake.Event) []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, 5)
	kv = append(kv, spanCriticality.String(e.Level.String()), spanAttempt.Int(e.Attempt), spanTrusted.Bool(e.Trusted))
	if e.ClientType != "" {
		kv = append(kv, attribute.String("triage.client_type", e.ClientType))
	}
	if t.customer && e.Customer != "" {
		kv = append(kv, spanCustomer.String(e.Customer))
	}
	return kv
}

// refusalAttributes say how a request was refused: the outcome's kind
// (task-overloaded, overloaded-dont-retry, out-of-quota), its reason, and
// whether the caller is told not to retry.
func refusalAttributes(e *intake.Event) []attribute.KeyValue {
	kind, reason := outcome.Classify(e.Err), ""
	if oe, ok := outcome.As(e.Err); ok {
		reason = oe.Reason
	}
	if r, _, ok := admission.RejectionOf(e.Err); ok {
		reason = r.String()
	}
	if kind == outcome.Failure { // a context's end, waiting for a slot
		reason = e.Err.Error()
	}
	return []attribute.KeyValue{
		attribute.String("triage.outcome", kind.String()),
		spanReason.String(reason),
		attribute.Bool("triage.dont_retry", kind == outcome.DontRetry),
		attribute.Float64("triage.wait", e.Wait.Seconds()),
	}
}

// spanName names the span of a request refused before any span
// existed: a gRPC method as otelgrpc names it ("pkg.Svc/Method", at most
// maxSpanName bytes, for a caller chooses it), else "triage.refused": an
// HTTP path would give every URL a name of its own.
func spanName(e *intake.Event) string {
	p := e.Path
	if e.Case != intake.LowerCase || len(p) < 2 || p[0] != '/' {
		return "triage.refused"
	}
	return p[1:min(len(p), maxSpanName)]
}

// maxSpanName bounds a refused request's span name.
const maxSpanName = 128

// headerCarrier reads a request's header for a propagator.
type headerCarrier struct {
	h         map[string][]string
	canonical bool
}

func (c headerCarrier) Get(key string) string {
	if c.canonical {
		key = http.CanonicalHeaderKey(key)
	}
	if v := c.h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c headerCarrier) Set(string, string) {}

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c.h))
	for k := range c.h {
		keys = append(keys, k)
	}
	return keys
}

type clientTracer struct{ t *Tracer }

// Trace implements retry.Tracer: an event on the span in ctx.
func (ct clientTracer) Trace(ctx context.Context, e *retry.Event) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	crit := spanCriticality.String(e.Level.String())
	switch e.Kind {
	case retry.Throttled:
		span.AddEvent(EventThrottled, trace.WithAttributes(crit, spanAttempt.Int(e.Attempt)))
	case retry.Retried:
		span.AddEvent(EventRetried, trace.WithAttributes(crit, spanAttempt.Int(e.Attempt),
			attribute.Float64("triage.backoff", e.Backoff.Seconds()), attribute.String("triage.outcome", outcome.Classify(e.Err).String())))
	case retry.BudgetRefused:
		span.AddEvent(EventBudgetRefused, trace.WithAttributes(crit, spanAttempt.Int(e.Attempt)))
	case retry.Exhausted:
		span.AddEvent(EventExhausted, trace.WithAttributes(crit, spanAttempt.Int(e.Attempt)))
	}
}
