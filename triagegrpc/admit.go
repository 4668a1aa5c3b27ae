package triagegrpc

import (
	"context"
	"sync/atomic"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/reqctx"
)

// admitted is the context node of an admitted request: criticality and
// attempt (answering the same keys as reqctx's node) and the admission
// Ticket, in one allocation. state guards the Ticket: the handler's
// goroutine and the context's AfterFunc (the safety net for requests that
// never reach a handler: unknown methods, streams reset before their first
// message) race to end it, and only one may.
type admitted struct {
	context.Context
	level, attempt uint8
	state          atomic.Uint32 // admittedPending, admittedRunning, admittedDone
	ctl            *admission.Controller
	ticket         admission.Ticket
	stop           func() bool
}

const (
	admittedPending uint32 = iota
	admittedRunning
	admittedDone
)

type admittedKey struct{}

func (n *admitted) Value(key any) any {
	switch key.(type) {
	case reqctx.CriticalityKey:
		return n.level
	case reqctx.IncomingAttemptKey:
		return n.attempt
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
func (s *Server) admit(ctx context.Context, l criticality.Level, n int) (context.Context, error) {
	deadline, _ := ctx.Deadline()
	node := &admitted{Context: ctx, level: uint8(l), attempt: uint8(n), ctl: s.admission}
	if err := s.admission.Arrive(&node.ticket, l, n, deadline); err != nil {
		return nil, s.rejection(err)
	}
	node.stop = context.AfterFunc(ctx, node.abandon)
	return node, nil
}

// start takes an execution slot for the handler.
func (n *admitted) start(ctx context.Context) error {
	if !n.state.CompareAndSwap(admittedPending, admittedRunning) {
		return ctx.Err() // the stream ended before its handler started
	}
	if err := n.ctl.Start(ctx, &n.ticket); err != nil {
		n.finish()
		return err
	}
	return nil
}

// finish ends a request whose handler ran (or tried to).
func (n *admitted) finish() {
	if n.state.CompareAndSwap(admittedRunning, admittedDone) {
		n.stop()
		n.ctl.Done(&n.ticket)
	}
}

// abandon ends a request whose stream ended before its handler started.
func (n *admitted) abandon() {
	if n.state.CompareAndSwap(admittedPending, admittedDone) {
		n.ctl.Done(&n.ticket)
	}
}
