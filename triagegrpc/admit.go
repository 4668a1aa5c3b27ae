package triagegrpc

import (
	"context"
	"sync"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/reqctx"
	"github.com/triagehq/triage/quota"
)

// admitted is the context node of an admitted request: criticality,
// attempt and customer (answering the same keys as reqctx's node), the
// admission Ticket and the request's cost measurement, in one allocation.
// Only the handler's goroutine touches the Ticket. A request admitted at
// the tap whose handler never runs (its stream was reset first, or the
// method is unknown) needs nothing: the Controller stops counting it after
// a few seconds.
type admitted struct {
	context.Context
	level, attempt uint8
	customer       string
	ctl            *admission.Controller // nil without admission control
	ticket         admission.Ticket
	meter          *cost.Meter  // nil without quotas
	usage          *quota.Usage // with meter

	// The cost measurement: outgoing calls (from any goroutine of the
	// handler) mark the request as waiting while at least one is open.
	mu    sync.Mutex
	waits int32
	ended bool
	req   cost.Request
}

type admittedKey struct{}

func (n *admitted) Value(key any) any {
	switch key.(type) {
	case reqctx.CriticalityKey:
		return n.level
	case reqctx.IncomingAttemptKey:
		return n.attempt
	case reqctx.CustomerKey:
		return n.customer
	case admittedKey:
		return n
	}
	return n.Context.Value(key)
}

func (n *admitted) String() string { return "triage admitted request context" }

func admittedOf(ctx context.Context) *admitted {
	n, _ := ctx.Value(admittedKey{}).(*admitted)
	return n
}

// admit asks the controller at arrival and returns the request's context.
func (s *Server) admit(ctx context.Context, l criticality.Level, n int, customer string) (context.Context, error) {
	var t admission.Ticket
	if s.admission != nil {
		deadline, _ := ctx.Deadline()
		// The ticket lives on the stack until the request is admitted, so
		// a rejection allocates nothing here.
		if err := s.admission.Arrive(&t, l, n, deadline); err != nil {
			return nil, s.rejection(err)
		}
	}
	return &admitted{Context: ctx, level: uint8(l), attempt: uint8(n), customer: customer,
		ctl: s.admission, ticket: t, meter: s.meter, usage: s.usage}, nil
}

// start takes an execution slot for the handler and starts measuring its
// cost; on error the request is already finished.
func (n *admitted) start(ctx context.Context) error {
	if n.ctl != nil {
		if err := n.ctl.Start(ctx, &n.ticket); err != nil {
			n.ctl.Done(&n.ticket)
			return err
		}
	}
	if n.meter != nil {
		n.meter.Begin(&n.req)
	}
	return nil
}

// finish ends a request whose handler ran: its slot goes back and its
// cost is charged to its customer.
func (n *admitted) finish() {
	if n.ctl != nil {
		n.ctl.Done(&n.ticket)
	}
	if n.meter != nil {
		n.mu.Lock()
		n.ended = true
		c := n.meter.End(&n.req)
		n.mu.Unlock()
		n.usage.Add(n.customer, criticality.Level(n.level), c)
	}
}

// block marks the request as waiting on an outgoing call (n may be nil).
func (n *admitted) block() {
	if n == nil || n.meter == nil {
		return
	}
	n.mu.Lock()
	if !n.ended {
		if n.waits == 0 {
			n.meter.Block(&n.req)
		}
		n.waits++
	}
	n.mu.Unlock()
}

// unblock ends a wait begun by block.
func (n *admitted) unblock() {
	if n == nil || n.meter == nil {
		return
	}
	n.mu.Lock()
	if !n.ended && n.waits > 0 {
		if n.waits--; n.waits == 0 {
			n.meter.Unblock(&n.req)
		}
	}
	n.mu.Unlock()
}
