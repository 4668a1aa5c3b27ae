package triagegrpc

import (
	"context"

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
	meter          *cost.Meter     // nil without quotas
	quota          *quota.Enforcer // with meter
	reserved       quota.Reservation
	cost           cost.Tracker // outgoing calls mark waits on it
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
	case reqctx.CostKey:
		if n.meter != nil {
			return &n.cost
		}
		return nil
	}
	return n.Context.Value(key)
}

func (n *admitted) String() string { return "triage admitted request context" }

func admittedOf(ctx context.Context) *admitted {
	n, _ := ctx.Value(admittedKey{}).(*admitted)
	return n
}

// admit asks the controller at arrival and returns the request's context.
func (s *Server) admit(ctx context.Context, l criticality.Level, n int, customer string, res quota.Reservation) (context.Context, error) {
	var t admission.Ticket
	if s.admission != nil {
		deadline, _ := ctx.Deadline()
		// The ticket lives on the stack until the request is admitted, so
		// a rejection allocates nothing here.
		if err := s.admission.Arrive(&t, l, n, deadline); err != nil {
			if s.quota != nil {
				s.quota.Cancel(customer, res)
			}
			return nil, s.rejection(err)
		}
	}
	return &admitted{Context: ctx, level: uint8(l), attempt: uint8(n), customer: customer,
		ctl: s.admission, ticket: t, meter: s.meter, quota: s.quota, reserved: res}, nil
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
		n.cost.Start(n.meter)
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
		n.quota.Done(n.customer, criticality.Level(n.level), n.reserved, n.cost.Stop())
	}
}
