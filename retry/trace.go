package retry

import (
	"context"
	"time"

	"github.com/triagehq/triage/criticality"
)

// A Tracer is told, with the request's context, what the client decided
// about one request, so that the decision can be recorded on the
// request's span (triageotel's Tracer does). It is called on the
// request's goroutine, only when one is given (WithTracer): it must be
// safe for concurrent use, return quickly, and not keep e.
type Tracer interface {
	Trace(ctx context.Context, e *Event)
}

// EventKind says what an Event reports.
type EventKind uint8

const (
	// Throttled: adaptive throttling rejected attempt Attempt locally;
	// it was not sent.
	Throttled EventKind = iota + 1
	// Retried: attempt Attempt (1: the first retry) is about to be sent,
	// after a backoff of Backoff; Err is the answer it retries.
	Retried
	// BudgetRefused: the retry budget refused attempt Attempt; Err is
	// the answer the request ends with.
	BudgetRefused
	// Exhausted: every attempt was rejected as overloaded; Err is the
	// last answer.
	Exhausted
)

// Event is one of the client's decisions about a request.
type Event struct {
	Kind    EventKind
	Level   criticality.Level
	Attempt int
	Backoff time.Duration
	Err     error
}

// WithTracer sets the Tracer told of each request's decisions. Default:
// none.
func WithTracer(t Tracer) Option { return optionFunc(func(c *config) { c.tracer = t }) }

// trace tells the Tracer, if any, of one decision.
func (p *Policy) trace(ctx context.Context, k EventKind, l criticality.Level, n int, backoff time.Duration, err error) {
	if p.tracer != nil {
		p.tracer.Trace(ctx, &Event{Kind: k, Level: l, Attempt: n, Backoff: backoff, Err: err})
	}
}
