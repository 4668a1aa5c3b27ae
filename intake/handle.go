package intake

import (
	"context"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/reqctx"
	"github.com/triagehq/triage/quota"
)

// Handle is an accepted request. It is also the request's context: it
// answers criticality.Of, attempt.Incoming, quota.CustomerOf and
// cost.TrackerFrom, and delegates everything else (deadline,
// cancellation, other values) to the context Accept was given. Pass it,
// or a context derived from it, to the handler; HandleOf finds it again.
//
// Call Start before the handler runs and, if Start succeeded, Finish once
// after it. Only one goroutine may call Start and Finish.
type Handle struct {
	parent         context.Context
	level, attempt uint8
	customer       string
	cancel         context.CancelFunc    // a rule's decay to cancel; nil otherwise
	ctl            *admission.Controller // nil without admission control
	ticket         admission.Ticket
	quota          *quota.Enforcer // nil without quotas
	meter          *cost.Meter     // with quota
	reserved       quota.Reservation
	cost           cost.Tracker // outgoing calls mark waits on it
}

type handleKey struct{}

func newHandle(ctx context.Context, l criticality.Level, f facts) *Handle {
	return &Handle{parent: ctx, level: uint8(l), attempt: uint8(f.attempt), customer: f.customer}
}

// HandleOf returns the Handle in ctx's chain, or nil.
func HandleOf(ctx context.Context) *Handle {
	h, _ := ctx.Value(handleKey{}).(*Handle)
	return h
}

// Level returns the criticality the request was accepted at (its
// current level then; a decay may lower it later, see criticality.Current).
func (h *Handle) Level() criticality.Level { return criticality.Level(h.level) }

// Start takes an execution slot (admission.Controller.Start, which may
// wait in the priority queue until the request's context ends) and starts
// measuring the request's CPU. On error, the request is finished: its
// slot and quota reservation are given back, and the error is the
// outcome to answer with.
func (h *Handle) Start() error {
	if h.ctl != nil {
		if err := h.ctl.Start(h, &h.ticket); err != nil {
			h.ctl.Done(&h.ticket)
			if h.quota != nil {
				h.quota.Cancel(h.customer, h.reserved)
			}
			h.stop()
			return err
		}
	}
	if h.meter != nil {
		h.cost.Start(h.meter)
	}
	return nil
}

// Finish ends a request whose handler ran: its execution slot goes back
// and its CPU is charged to its customer.
func (h *Handle) Finish() {
	if h.ctl != nil {
		h.ctl.Done(&h.ticket)
	}
	if h.meter != nil {
		h.quota.Done(h.customer, criticality.Level(h.level), h.reserved, h.cost.Stop())
	}
	h.stop()
}

func (h *Handle) stop() {
	if h.cancel != nil {
		h.cancel()
	}
}

// Deadline implements context.Context.
func (h *Handle) Deadline() (time.Time, bool) { return h.parent.Deadline() }

// Done implements context.Context.
func (h *Handle) Done() <-chan struct{} { return h.parent.Done() }

// Err implements context.Context.
func (h *Handle) Err() error { return h.parent.Err() }

// Value implements context.Context.
func (h *Handle) Value(key any) any {
	switch key.(type) {
	case reqctx.CriticalityKey:
		return h.level
	case reqctx.IncomingAttemptKey:
		return h.attempt
	case reqctx.CustomerKey:
		return h.customer
	case handleKey:
		return h
	case reqctx.CostKey:
		if h.meter != nil {
			return &h.cost
		}
		return nil
	}
	return h.parent.Value(key)
}

func (h *Handle) String() string { return "triage request context" }
