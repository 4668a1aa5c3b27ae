package intake

import (
	"context"
	"time"

	"github.com/triagehq/triage/criticality"
)

// A Tracer is told, with the request's context, what the intake decided
// for one request, so that the decision can be recorded on the request's
// span (triageotel's Tracer does). It is called on the request's
// goroutines, only when one is given (WithTracer): it must be safe for
// concurrent use, return quickly, and not keep e after it returns.
type Tracer interface {
	Trace(ctx context.Context, e *Event)
}

// EventKind says what an Event reports.
type EventKind uint8

const (
	// Refused: the request was refused; Err is the outcome it is
	// answered with. At Accept, ctx is Accept's and Header and Path are
	// set (no span may exist yet: gRPC's tap runs before its stats
	// handlers); at Start, the request waited for a slot for Wait.
	Refused EventKind = iota + 1
	// Admitted: the request took its execution slot (Start) after
	// waiting Wait for it in admission control's queue (0: it did not
	// queue, or there is no admission control).
	Admitted
	// Charged: the request finished and CPU was charged to its
	// customer's quota.
	Charged
)

// Event is one of the intake's decisions about a request.
type Event struct {
	Kind EventKind
	// What the intake decided about the request: its criticality (as
	// decayed), attempt counter, customer and client type ("" when none).
	Level      criticality.Level
	Attempt    int
	Customer   string
	ClientType string
	Trusted    bool
	// Path is the request's path or gRPC full method.
	Path string
	// Header is the request's header, spelled as Case says, for a
	// Refused event at Accept; nil otherwise. Read it only during Trace.
	Header map[string][]string
	Case   HeaderCase
	// Wait is the time spent waiting for an execution slot (Admitted, and
	// Refused at Start).
	Wait time.Duration
	// CPU is the CPU charged (Charged).
	CPU time.Duration
	// Err is the outcome the request is refused with (Refused).
	Err error
}

// WithTracer sets the Tracer told of each request's decisions. Default:
// none, and nothing is built for it.
func WithTracer(t Tracer) Option { return optionFunc(func(in *Intake) { in.tracer = t }) }

// traced is what a Handle keeps for its Tracer.
type traced struct {
	t          Tracer
	ctx        context.Context // the context whose span is told: Accept's, or TraceIn's
	path       string
	clientType string
	trusted    bool
}

// TraceIn names the context whose span the intake's Tracer is told this
// request's later decisions on (Start, Finish), when it is not the one
// Accept was given: gRPC's stats handlers, which start the server span,
// run after its tap. Call it before Start; without a Tracer it does
// nothing.
func (h *Handle) TraceIn(ctx context.Context) {
	if h.tr != nil {
		h.tr.ctx = ctx
	}
}

// event returns the Event of kind k for h.
func (h *Handle) event(k EventKind) *Event {
	return &Event{Kind: k, Level: criticality.Level(h.level), Attempt: int(h.attempt), Customer: h.customer,
		ClientType: h.tr.clientType, Trusted: h.tr.trusted, Path: h.tr.path}
}

// traceStart tells the Tracer how Start ended, after waiting wait.
func (h *Handle) traceStart(wait time.Duration, err error) {
	if h.tr == nil {
		return
	}
	e := h.event(Admitted)
	e.Wait = wait
	if err != nil {
		e.Kind, e.Err = Refused, err
	}
	h.tr.t.Trace(h.tr.ctx, e)
}

// traceRefusal tells the Tracer of a refusal at Accept.
func (in *Intake) traceRefusal(ctx context.Context, r *Request, l criticality.Level, f *facts, err error) {
	in.tracer.Trace(ctx, &Event{Kind: Refused, Level: l, Attempt: f.attempt, Customer: f.customer, ClientType: f.clientType,
		Trusted: f.trusted, Path: r.Path, Header: r.Header, Case: r.Case, Err: err})
}
