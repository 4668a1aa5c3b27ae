package intake

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/reqctx"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/shadow"
)

// Handle is an accepted request. It is also the request's context: it
// answers criticality.Of, attempt.Incoming, quota.CustomerOf and
// cost.TrackerFrom, and delegates everything else (deadline,
// cancellation, other values) to the context Accept was given. Pass it,
// or a context derived from it, to the handler; HandleOf finds it again.
//
// Call Start before the handler runs and, if Start succeeded, Finish once
// after it, also when the handler panics. Where the handler waits on its
// own client (a streaming response the client does not read, a stream's
// next message), call ClientWait before the wait and ClientResume after
// it, from whichever of the request's goroutines waits. Only the
// handler's own goroutine may call Start and Finish.
type Handle struct {
	parent         // its Deadline, Done and Err are the Handle's
	customer       string
	x              *admitted // nil without admission control, quotas and a decay to cancel
	tr             *traced   // nil without a Tracer
	level, attempt uint8
}

// admitted is what a Handle keeps under admission control or quotas, or
// with a decay that cancels. It is allocated with its Handle
// (admittedHandle), so that an admitted request is still one allocation
// and a plain one a small one.
type admitted struct {
	cancel   context.CancelFunc    // a rule's decay to cancel; nil otherwise
	ctl      *admission.Controller // nil without admission control
	shadow   *Intake               // admission is in shadow: Start never waits (WithShadow)
	ticket   admission.Ticket
	quota    *quota.Enforcer // nil without quotas
	meter    *cost.Meter     // with quota
	reserved quota.Reservation
	cost     cost.Tracker // outgoing calls mark waits on it
	clk      clock.Clock
	h        *Handle     // the request: its context bounds a wait for a slot
	conn     connMark    // the request's connection's counts
	peer     peerMark    // its peer's count (WithPeerShare)
	client   clientWaits // its goroutines' waits on its own client
	// overBound: the last Stall found the task's stalls at their bound
	// (under client.mu, through the cost Tracker).
	overBound bool
	// readyAt is when the request's goroutine began to run (Scheduled);
	// message says whether its first message then came late (messageLate)
	// or not (messageOnTime), once it has (MessageArrived).
	readyAt time.Time
	message atomic.Int32
	// begun is 0 until Start or Abandon takes the request: one of them
	// settles its ticket and reservation, once.
	begun atomic.Bool
}

const (
	messageOnTime = 1 + iota
	messageLate
)

type admittedHandle struct {
	h Handle
	x admitted
}

type handleKey struct{}

// parent is the context Accept was given, embedded in its Handle under a
// name of its own.
type parent = context.Context

func newHandle(ctx context.Context, l criticality.Level, f facts) *Handle {
	return &Handle{parent: ctx, level: uint8(l), attempt: uint8(f.attempt), customer: f.customer}
}

func newAdmittedHandle(ctx context.Context, l criticality.Level, f facts) *Handle {
	ah := &admittedHandle{h: Handle{parent: ctx, level: uint8(l), attempt: uint8(f.attempt), customer: f.customer}}
	ah.h.x = &ah.x
	ah.x.h = &ah.h
	return &ah.h
}

// HandleOf returns the Handle in ctx's chain, or nil.
func HandleOf(ctx context.Context) *Handle {
	h, _ := ctx.Value(handleKey{}).(*Handle)
	return h
}

// Scheduled tells admission control that the request's own goroutine has
// begun to run (admission.Controller.Scheduled): until Start, a request
// waiting for its message then waits on its client and takes no room.
// Adapters whose requests get a goroutine of their own after Accept call
// it first thing on it; it is optional.
func (h *Handle) Scheduled() {
	if x := h.x; x != nil && x.ctl != nil {
		x.conn.leaveWaiting()
		x.ctl.Scheduled(&x.ticket)
		x.readyAt = x.clk.Now()
	}
}

// MessageArrived tells the Handle that the request's first message has
// arrived, where the transport sees it (the gRPC adapter: its stats
// handler's first InPayload); later calls do nothing. A message that came
// more than the message timeout after Scheduled was sent late: if
// admission then refuses the request as Late, its connection gets a
// slow-sender penalty (Conn).
func (h *Handle) MessageArrived() {
	x := h.x
	if x == nil || x.ctl == nil {
		return
	}
	x.conn.leaveProbation()
	if x.readyAt.IsZero() || x.message.Load() != 0 {
		return
	}
	state := int32(messageOnTime)
	if x.clk.Now().Sub(x.readyAt) > x.ctl.MessageTimeout() {
		state = messageLate
	}
	x.message.CompareAndSwap(0, state)
}

// Received tells the Handle that the transport itself read the request's
// message while the request waited on its client (Scheduled; triagehttp's
// read-ahead of a body): the time the client took is not the task's, so
// admission does not judge the request late for it at Start
// (admission.Controller.Received), however slow its link. Optional.
func (h *Handle) Received() {
	if x := h.x; x != nil && x.ctl != nil {
		x.ctl.Received(&x.ticket)
	}
}

// senderLate reports whether the request's first message came more than
// the message timeout (admission.Controller.MessageTimeout) after the
// request's goroutine was ready for it (Scheduled, MessageArrived): a
// delay its sender caused, not the server (its scheduler, GC, or the
// interceptors that ran before triage's). It is false when either was not
// told.
func (h *Handle) senderLate() bool {
	return h.x != nil && h.x.message.Load() == messageLate
}

// MessageTimedOut ends a request whose transport waited for its message
// itself, from Scheduled, and gave up after the message timeout
// (admission.Controller.MessageTimeout; triagehttp's read-ahead of a
// body): the request is abandoned (Abandon), its sender counts as late,
// and its connection gets a slow-sender penalty (Conn).
func (h *Handle) MessageTimedOut() {
	x := h.x
	if x != nil && x.ctl != nil && !x.readyAt.IsZero() && x.message.CompareAndSwap(0, messageLate) && x.conn.in != nil {
		x.conn.in.penalise(x.conn.c)
	}
	h.Abandon()
}

// InShadow reports whether the request's admission is in shadow
// (WithShadow): what would refuse it is counted and lets it through, so a
// transport must not refuse it either, for a slow body say.
func (h *Handle) InShadow() bool { return h.x != nil && h.x.shadow != nil }

// Abandon ends a request that will not run because it ended before Start
// (its client went away, or did not send its message in time, or the
// transport dropped it): its admission ticket and quota reservation are
// given back. It does nothing once Start was called, and may be called
// more than once, from any goroutine: a transport calls it wherever it
// learns for sure that the request is over (the gRPC adapter: at the
// stream's end). Start after it refuses the request.
func (h *Handle) Abandon() {
	if x := h.x; x != nil {
		x.conn.leave()
		x.peer.leave()
		if !x.begun.CompareAndSwap(false, true) {
			return // started, or abandoned already
		}
		if x.ctl != nil {
			x.ctl.Done(&x.ticket)
		}
		if x.quota != nil {
			x.quota.Cancel(h.customer, x.reserved)
		}
	}
	h.stop()
}

// Holds reports whether the request holds something beyond its admission
// ticket that only Start and Finish, or Abandon, give back: a quota
// reservation (quota.ModePessimistic), a decay's timer, or a place in its
// connection's probation count until its message comes. A transport that
// may drop a request without either calls Abandon where it learns the
// request is over.
func (h *Handle) Holds() bool {
	x := h.x
	return x != nil && (x.cancel != nil || x.quota != nil && x.reserved != (quota.Reservation{}) || x.conn.probation.Load())
}

// Start takes an execution slot (admission.Controller.Start, which may
// wait in the priority queue until the request's context ends) and starts
// measuring the request's CPU. On error, the request is finished: its
// slot and quota reservation are given back, and the error is the
// outcome to answer with.
func (h *Handle) Start() error { return h.start(h) }

// StartWithin is Start waiting for a slot at most d: a request still
// waiting then is refused (admission's Deadline rejection, an overload
// outcome), as if its deadline were d away, while its context keeps its
// own deadline. A transport whose peer gives up at a fixed time (Envoy's
// message_timeout) answers before it.
func (h *Handle) StartWithin(d time.Duration) error {
	if h.x == nil {
		return h.Start()
	}
	return h.start(boundedWait{Context: h, by: h.x.clk.Now().Add(d)})
}

// boundedWait is a request's context for a wait bounded at by: Deadline
// reports by (or the request's own deadline, if sooner), but only the
// request's end cancels it, so that the wait ends in admission's refusal
// (Deadline), an overload outcome, rather than in the context's error.
type boundedWait struct {
	context.Context
	by time.Time
}

func (b boundedWait) Deadline() (time.Time, bool) {
	if d, ok := b.Context.Deadline(); ok && d.Before(b.by) {
		return d, true
	}
	return b.by, true
}

// start is Start, waiting for a slot until wait ends.
func (h *Handle) start(wait context.Context) error {
	x := h.x
	if x == nil {
		h.traceStart(0, nil)
		return nil
	}
	if !x.begun.CompareAndSwap(false, true) {
		return context.Canceled // abandoned: the transport dropped the request
	}
	x.conn.leaveWaiting()
	var began time.Time
	if h.tr != nil && x.ctl != nil {
		began = x.clk.Now()
	}
	if x.ctl != nil && x.shadow != nil {
		x.startShadow(h)
	} else if x.ctl != nil {
		if err := x.ctl.Start(wait, &x.ticket); err != nil {
			h.traceStart(x.since(began), err)
			x.conn.leave()
			x.peer.leave()
			x.penaliseLate(h, err)
			x.ctl.Done(&x.ticket)
			if x.quota != nil {
				x.quota.Cancel(h.customer, x.reserved)
			}
			h.stop()
			return err
		}
	}
	if x.meter != nil || x.ctl != nil {
		var b cost.Blocker
		if x.ctl != nil {
			b = x
		}
		x.cost.StartWith(x.meter, b)
	}
	if x.ticket.Queued() {
		h.traceStart(x.since(began), nil)
	} else {
		h.traceStart(0, nil)
	}
	return nil
}

// since is the time from t (zero: not measured) to now.
func (x *admitted) since(t time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return x.clk.Now().Sub(t)
}

// startShadow is Start with admission in shadow: the request takes a
// slot if one is free, runs without one if it would have waited for one,
// and runs untracked if admission would have refused it (told to the
// shadow observer, its quota reservation cancelled and not charged; a late sender's connection is penalised all the same,
// for the connection penalty to decide on, in shadow or not).
func (x *admitted) startShadow(h *Handle) {
	err := x.ctl.Start(h, &x.ticket) // in shadow: never waits
	if err == nil || errors.Is(err, admission.ErrWouldWait) {
		if h.senderLate() { // a message the transport waited for past the timeout, in shadow
			done := false
			x.shadow.shadows(shadow.Admission, "late", criticality.Level(h.level), &done)
		}
		return
	}
	x.penaliseLate(h, err)
	done := false
	x.shadow.shadowsAdmission(err, criticality.Level(h.level), &done)
	x.ctl.Done(&x.ticket)
	if x.quota != nil {
		x.quota.Cancel(h.customer, x.reserved)
	}
	x.ctl, x.quota, x.meter = nil, nil, nil
}

// penaliseLate gives the request's connection a slow-sender penalty when
// err refused it as late and its sender was the one late.
func (x *admitted) penaliseLate(h *Handle, err error) {
	if r, _, ok := admission.RejectionOf(err); ok && r == admission.Late && x.conn.in != nil && h.senderLate() {
		x.conn.in.penalise(x.conn.c)
	}
}

// Block and Unblock tell admission control that the request waits on its
// outgoing calls (admission.Controller.Away and Back); the cost Tracker
// calls them under its lock.
func (x *admitted) Block()   { x.ctl.Away(&x.ticket) }
func (x *admitted) Unblock() { x.ctl.Back(&x.ticket) }

// Stall and Unstall tell admission control that the request waits on its
// own client (admission.Controller.Stall and Unstall); the cost Tracker
// calls them under its lock.
func (x *admitted) Stall() {
	if !x.ctl.Stall(&x.ticket) {
		x.overBound = true // past the task's bound (clientStalled)
	}
}

// Unstall waits for an execution slot, ahead of every request not yet
// started, until the request's context ends.
func (x *admitted) Unstall() { _ = x.ctl.Unstall(x.h, &x.ticket) }

// UnderAdmission reports whether the request is under admission control:
// whether ClientWait and ClientResume do anything, so that adapters wrap
// the handler's stream or writer for them only then.
func (h *Handle) UnderAdmission() bool { return h.x != nil && h.x.ctl != nil }

// Finish ends a request whose handler ran: its execution slot goes back
// and its CPU is charged to its customer.
func (h *Handle) Finish() {
	if x := h.x; x != nil {
		x.conn.leave()
		x.peer.leave()
		x.endClientWaits()
		used := x.cost.Stop() // first: no outgoing call touches the ticket after it
		if x.ctl != nil {
			x.ctl.Done(&x.ticket)
		}
		if x.meter != nil {
			x.quota.Done(h.customer, criticality.Level(h.level), x.reserved, used)
			if h.tr != nil {
				e := h.event(Charged)
				e.CPU = used
				h.tr.t.Trace(h.tr.ctx, e)
			}
		}
	}
	h.stop()
}

func (h *Handle) stop() {
	if h.x != nil && h.x.cancel != nil {
		h.x.cancel()
	}
}

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
		if h.x != nil && (h.x.meter != nil || h.x.ctl != nil) {
			return &h.x.cost
		}
		return nil
	}
	return h.parent.Value(key)
}
