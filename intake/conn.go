package intake

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/outcome"
)

// Conn is what the intake keeps of one client connection, for the
// connection policy that applies under admission control:
//
//   - its share: a request arriving while DefaultConnShare (WithConnShare)
//     others of its connection are accepted and not yet running (waiting
//     for their goroutine, or for Start) gets only the first half of the
//     task's room (admission.OverShare), so that one
//     connection's burst does not lock the others out;
//   - its stalls: at most DefaultMaxConnStalls (WithMaxConnStalls) of its
//     requests may be stalled at once, waiting on their client without a
//     slot (Handle.ClientWait);
//   - its slow-sender penalty: once one of its requests was refused
//     because its sender sent the message late (Handle.MessageArrived
//     long after Handle.Scheduled, or Handle.MessageTimedOut), its next requests, health checks aside,
//     are refused at Accept for DefaultSlowSenderPenalty, doubling to
//     MaxSlowSenderPenalty while it offends again, and then it is on
//     probation for MaxSlowSenderPenalty, holding at most its share of
//     requests whose message has not come. Such refusals come at most one
//     per SlowSenderPace, the Accept waiting in between, and are counted
//     (Intake.SlowSenderRefusals). A trusted peer (a proxy carrying many
//     callers) is not penalised unless WithTrustedSlowSenderPenalty.
//
// A transport makes one Conn per connection when the connection opens
// (new(Conn)) and passes it in every Request from that connection
// (Request.Conn); it lives and dies with the connection, in a few words.
// A Conn belongs to one Intake. Its zero value is ready to use, and it is
// safe for concurrent use.
type Conn struct {
	waiting   atomic.Int32 // accepted, not yet running
	probation atomic.Int32 // admitted on probation, message not come
	stalls    atomic.Int32 // stalled now
	// slowUntil is when the penalty ends, on the Intake's clock (ns since
	// its start); 0: never penalised. paceNext is when the next refusal
	// as a slow sender's is due.
	slowUntil atomic.Int64
	paceNext  atomic.Int64
	mu        sync.Mutex    // orders penalties
	penalty   time.Duration // the last one given
}

// stalled returns how many of the connection's requests are stalled.
func (c *Conn) stalled() int { return int(c.stalls.Load()) }

// The connection policy's defaults and bounds.
const (
	// DefaultConnShare is how many of a connection's requests may be
	// accepted and not yet running before its next is over its share.
	DefaultConnShare = 8
	// DefaultMaxConnStalls is how many requests of one connection may be
	// stalled at once.
	DefaultMaxConnStalls = 64
	// DefaultSlowSenderPenalty is how long a connection whose request
	// sent its message late has its next requests refused at Accept.
	DefaultSlowSenderPenalty = time.Second
	// MaxSlowSenderPenalty bounds the doubling of a penalty, and is how
	// long probation lasts after one.
	MaxSlowSenderPenalty = time.Minute
	// SlowSenderPace is how often, at most, a connection's request is
	// refused as a slow sender's; Accept waits in between, so a transport
	// that calls it on the connection's reader (gRPC's tap) reads nothing
	// more from the connection until then.
	SlowSenderPace = time.Millisecond
)

// ErrSlowSender is the outcome of a request refused because its
// connection serves a slow-sender penalty or is over its share on
// probation: an admission rejection for lateness (admission.RejectionOf
// says admission.Late), task overloaded. It is shared; do not modify it.
var ErrSlowSender = &outcome.Error{Kind: outcome.TaskOverloaded, Reason: admission.Late.String()}

// WithConnShare sets how many of a connection's requests may be accepted
// and not yet running before its next is over its share (Conn), and how
// many requests without their message a slow sender's connection may hold
// on probation; 0 turns both off. Default DefaultConnShare.
func WithConnShare(n int) Option {
	return optionFunc(func(in *Intake) { in.connShare = int32(min(max(n, 0), 1<<30)) })
}

// WithMaxConnStalls bounds the requests of one connection that may be
// stalled at once (Conn); past it, a request waiting on its client keeps
// its slot. 0: none stalls. Default DefaultMaxConnStalls.
func WithMaxConnStalls(n int) Option {
	return optionFunc(func(in *Intake) { in.maxConnStalls = int32(min(max(n, 0), 1<<30)) })
}

// WithTrustedSlowSenderPenalty penalises slow senders among trusted peers
// too (WithTrust). By default a trusted peer's connection is never
// penalised: it is typically a proxy multiplexing many callers, and one
// slow caller would penalise them all; the late request itself is still
// refused.
func WithTrustedSlowSenderPenalty() Option {
	return optionFunc(func(in *Intake) { in.penaliseTrusted = true })
}

// SlowSenderRefusals returns how many requests Accept refused as a slow
// sender's (ErrSlowSender). They are refused before they are classified,
// so admission control's observer does not see them.
func (in *Intake) SlowSenderRefusals() uint64 { return in.slowRefused.Load() }

// now is the Intake's clock as ns since its start.
func (in *Intake) now() int64 { return int64(in.clock.Now().Sub(in.start)) }

// refuseSlow refuses, paced, a request of a connection serving a penalty
// or over its share on probation; probation says whether the connection
// is on probation otherwise.
func (in *Intake) refuseSlow(ctx context.Context, c *Conn, shadowed bool) (probation bool, err error) {
	u := c.slowUntil.Load()
	if u == 0 {
		return false, nil
	}
	now := in.now()
	penalty := now < u
	probation = in.connShare > 0 && now < u+int64(MaxSlowSenderPenalty)
	if !penalty && !(probation && c.probation.Load() >= in.connShare) {
		return probation, nil
	}
	if !shadowed {
		in.pace(ctx, c, now)
		in.slowRefused.Add(1)
	}
	return false, ErrSlowSender
}

// pace waits until the connection's next refusal as a slow sender is due,
// or ctx ends, and books the one after it a pace later.
func (in *Intake) pace(ctx context.Context, c *Conn, now int64) {
	var due int64
	for {
		next := c.paceNext.Load()
		due = max(next, now)
		if c.paceNext.CompareAndSwap(next, due+int64(SlowSenderPace)) {
			break
		}
	}
	if due <= now {
		return
	}
	t := in.clock.NewTimer(time.Duration(due - now))
	select {
	case <-t.C():
	case <-ctx.Done():
		t.Stop()
	}
}

// penalise gives c a slow-sender penalty: DefaultSlowSenderPenalty, or
// twice the last one while c offends again within MaxSlowSenderPenalty of
// its end. One penalty per burst: a refusal during a penalty adds nothing.
func (in *Intake) penalise(c *Conn) {
	now := in.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	until := c.slowUntil.Load()
	if now < until {
		return
	}
	p := DefaultSlowSenderPenalty
	if until != 0 && now < until+int64(MaxSlowSenderPenalty) {
		p = min(2*c.penalty, MaxSlowSenderPenalty)
	}
	c.penalty = p
	c.slowUntil.Store(max(now, 1) + int64(p))
}

// connMark is what an admitted request holds of its connection: its place
// in the waiting count until it runs, and in the probation count until its
// message comes; each is left once.
type connMark struct {
	c         *Conn
	maxStalls int32
	in        *Intake // a late message penalises the connection; nil: it does not
	waiting   atomic.Bool
	probation atomic.Bool
}

func (m *connMark) leaveWaiting() {
	if m.c != nil && m.waiting.CompareAndSwap(true, false) {
		m.c.waiting.Add(-1)
	}
}

func (m *connMark) leaveProbation() {
	if m.c != nil && m.probation.CompareAndSwap(true, false) {
		m.c.probation.Add(-1)
	}
}

// leave leaves both counts.
func (m *connMark) leave() {
	m.leaveWaiting()
	m.leaveProbation()
}

// stall counts a stall against the connection's bound; false past it.
func (m *connMark) stall() bool {
	if m.c == nil {
		return true
	}
	if m.c.stalls.Add(1) > m.maxStalls {
		m.c.stalls.Add(-1)
		return false
	}
	return true
}

func (m *connMark) unstall() {
	if m.c != nil {
		m.c.stalls.Add(-1)
	}
}
