// Package intake is the path every request takes into a triage server,
// written once for every transport: trust, stripping of untrusted triage
// keys, classification, decay, customer, client type, quota reservation
// and admission.
//
// An Intake models a server's front door. A transport adapter (triagegrpc's
// tap handle, triagehttp's middleware) fills a Request with what it knows
// about one arriving request and calls Accept, which either refuses the
// request with an overload outcome to answer with, or returns a Handle: the
// request's context, carrying its criticality, attempt and customer. The
// adapter calls Start before the handler runs (it takes an execution slot,
// and may wait for one) and Finish after it. A transport that follows its
// connections gives each a Conn and names it in every Request, for the
// connection policy under admission control (share, stalls, slow-sender
// penalty).
//
// The zero value is not usable; call New. An Intake is safe for
// concurrent use and keeps no per-request state: each Handle is one
// allocation, and a refusal allocates nothing in the intake. Its bounds are
// those of the mechanisms it is given (admission, quota, isolation), and a
// Conn is a few words per connection, held by the transport.
package intake

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/shadow"
	"github.com/triagehq/triage/trust"
	"github.com/triagehq/triage/wire"
)

// Intake runs requests through the policy pipeline. Create one with New.
type Intake struct {
	trust      *trust.Policy
	classifier *edge.Classifier
	admission  *admission.Controller
	quota      *quota.Enforcer
	meter      *cost.Meter
	iso        *isolate.Table
	customerID bool
	clock      clock.Clock
	start      time.Time // the clock's reading at New: Conn's times count from it
	// the connection policy (Conn)
	connShare       int32
	maxConnStalls   int32
	peerShare       int32  // WithPeerShare
	peers           *peers // nil: not counted
	penaliseTrusted bool
	slowRefused     atomic.Uint64
	// shadow mode (WithShadow)
	shadow    shadow.Set
	shadowObs shadow.Observer
	tracer    Tracer // WithTracer; nil: none
}

// Option configures an Intake.
type Option interface{ apply(*Intake) }

type optionFunc func(*Intake)

func (f optionFunc) apply(in *Intake) { f(in) }

// WithTrust sets the peers whose triage keys are believed. Default: none
// (every peer is untrusted: its triage keys are stripped, and criticality
// comes from the classifier's other rules or its default).
func WithTrust(p *trust.Policy) Option { return optionFunc(func(in *Intake) { in.trust = p }) }

// WithClassifier sets the rules that assign criticality. Default:
// edge.HeaderOnly() (a trusted peer's header, else CRITICAL).
func WithClassifier(c *edge.Classifier) Option {
	return optionFunc(func(in *Intake) { in.classifier = c })
}

// WithAdmission installs admission control: Accept asks the Controller
// whether the request may enter (admission.Controller.Arrive), and Start
// takes an execution slot. Default: none.
func WithAdmission(c *admission.Controller) Option {
	return optionFunc(func(in *Intake) { in.admission = c })
}

// WithQuota installs per-customer quotas: Accept asks e whether the
// request's customer is within its quota (quota.Enforcer.Reserve) before
// admission control; the handler's CPU, measured with m from Start to
// Finish less the waits marked on its cost.Tracker, is charged to the
// customer. Default: none.
func WithQuota(e *quota.Enforcer, m *cost.Meter) Option {
	return optionFunc(func(in *Intake) { in.quota, in.meter = e, m })
}

// WithIsolation names each request's client type from its host
// (isolate.Table.ClientFor) and puts it in the request's context
// (isolate.ClientOf); a black-holed client type is refused with
// isolate.ErrBlackHoled. Default: none.
func WithIsolation(t *isolate.Table) Option { return optionFunc(func(in *Intake) { in.iso = t }) }

// WithCustomerFromIdentity makes the peer's verified mTLS identity (its
// first identity, see trust.Peer) the customer of requests without a
// trusted triage-customer, if it is a valid customer name of at most
// wire.CustomerMaxLen bytes (the most triage-customer carries to the next
// hop). Default: only a trusted peer's triage-customer names a customer;
// others have none.
func WithCustomerFromIdentity() Option {
	return optionFunc(func(in *Intake) { in.customerID = true })
}

// WithClock sets the clock that starts decays and reads them. Default:
// the admission controller's (admission.Controller.Clock), or
// clock.Real() without one; a clock other than the controller's is an
// error. Time is set once, on the controller, for a server with one.
func WithClock(c clock.Clock) Option { return optionFunc(func(in *Intake) { in.clock = c }) }

// New returns an Intake, or an error for an inconsistent configuration.
func New(opts ...Option) (*Intake, error) {
	in := &Intake{connShare: DefaultConnShare, maxConnStalls: DefaultMaxConnStalls}
	for _, o := range opts {
		o.apply(in)
	}
	if in.classifier == nil {
		cl, err := edge.New(edge.HeaderOnly())
		if err != nil {
			return nil, fmt.Errorf("intake: %w", err)
		}
		in.classifier = cl
	}
	if (in.quota == nil) != (in.meter == nil) {
		return nil, errors.New("intake: WithQuota needs both an Enforcer and a cost Meter")
	}
	if in.admission != nil {
		switch ctl := in.admission.Clock(); {
		case in.clock == nil:
			in.clock = ctl
		case in.clock != ctl:
			return nil, errors.New("intake: WithClock is not the admission controller's clock: give the controller the clock, once")
		}
	}
	in.clock = clock.OrReal(in.clock)
	in.start = in.clock.Now()
	return in, nil
}

// NeedsGroup reports whether a classifier rule matches on the user group,
// so that an adapter computes Request.Group only when it is used.
func (in *Intake) NeedsGroup() bool { return in.classifier.NeedsGroup() }

// HeaderCase says how a transport spells header keys.
type HeaderCase uint8

const (
	// LowerCase is gRPC metadata's spelling: triage-criticality.
	LowerCase HeaderCase = iota
	// Canonical is net/http's canonical spelling: Triage-Criticality.
	Canonical
)

// Request is what a transport knows about an arriving request.
type Request struct {
	// Peer is the caller: its address and verified identities.
	Peer trust.Peer
	// Host is the HTTP Host or the gRPC :authority, port allowed.
	Host string
	// Path is the URL path, or the gRPC full method ("/pkg.Svc/Method").
	Path string
	// Header is the request's header (gRPC metadata or an http.Header),
	// spelled as Case says. Accept edits it in place: an untrusted peer's
	// triage keys are deleted.
	Header map[string][]string
	// Case is Header's spelling.
	Case HeaderCase
	// Group is the user group for group rules; fill it only when
	// NeedsGroup.
	Group string
	// Conn is the request's connection, if the transport follows its
	// connections (one Conn per connection): the connection policy
	// (share, stalls, slow-sender penalty) applies to it under admission
	// control. nil: none does.
	Conn *Conn
	// HealthCheck marks a health check (the transport knows its methods):
	// it is classified but answered whatever the load, outside isolation,
	// quotas and admission, because it is how clients learn that a task is
	// in lame duck, and a watch lasts as long as its connection.
	HealthCheck bool
	// RunQueued says the request waited in Go's run queue before Accept,
	// where admission could not count it: the transport reads each
	// request and runs its handler on one goroutine, as net/http does
	// (admission.RunQueued).
	RunQueued bool
}

// the triage keys Accept reads, in both spellings.
type keySpelling struct{ lower, canonical string }

var (
	keyCriticality = keySpelling{wire.CriticalityKey, wire.CriticalityHeader}
	keyDecay       = keySpelling{wire.DecayKey, wire.DecayHeader}
	keyAttempt     = keySpelling{wire.AttemptKey, wire.AttemptHeader}
	keyCustomer    = keySpelling{wire.CustomerKey, wire.CustomerHeader}
	keyXFCC        = keySpelling{wire.ForwardedClientCertKey, wire.ForwardedClientCertHeader}
)

// last returns the last value of key in r's header, or "".
func (r *Request) last(k keySpelling) string {
	name := k.lower
	if r.Case == Canonical {
		name = k.canonical
	}
	if v := r.Header[name]; len(v) > 0 {
		return v[len(v)-1]
	}
	return ""
}

// single returns the only value of key in r's header; absent or repeated
// gives "" (a repeated triage key is malformed and ignored).
func (r *Request) single(k keySpelling) string {
	name := k.lower
	if r.Case == Canonical {
		name = k.canonical
	}
	v := r.Header[name]
	if len(v) != 1 {
		return ""
	}
	return v[0]
}

// facts is what Accept learned of the request: what a trusted peer's keys
// say, whether the peer is trusted, and whether its connection is on
// probation.
type facts struct {
	attempt            int
	customer           string
	clientType         string
	decay              string
	trusted, probation bool
	// shadowed: a mechanism in shadow would have refused the request
	// (WithShadow); the later ones in shadow skip it.
	shadowed bool
}

func (r *Request) trustedFacts(er *edge.Request, f *facts) {
	er.Header = r.single(keyCriticality)
	f.decay = r.single(keyDecay)
	if v := r.single(keyAttempt); v != "" {
		f.attempt, _ = attempt.Parse(v)
	}
	if v := r.single(keyCustomer); len(v) <= wire.CustomerMaxLen {
		f.customer = quota.Customer(v)
	}
}

// strip deletes every triage key from h, reporting each to obs.
func strip(h map[string][]string, obs edge.Observer) {
	for k := range h {
		if !wire.IsTriage(k) {
			continue
		}
		if key, ok := wire.Lookup(k); ok {
			obs.Stripped(key.Name)
		} else {
			obs.Stripped("unregistered")
		}
		delete(h, k)
	}
}

// dropFolded deletes from a trusted peer's h the triage keys spelled with
// an underscore (wire.Folded), reporting each to obs.
func dropFolded(h map[string][]string, obs edge.Observer) {
	for k := range h {
		if wire.Folded(k) {
			obs.Stripped("unregistered")
			delete(h, k)
		}
	}
}

// Accept runs r through the pipeline: trust, stripping, classification,
// decay, customer, client type, quota reservation and admission. It
// returns the accepted request's Handle, whose context is ctx plus what
// was decided, or the outcome to answer with: isolate.ErrBlackHoled, the quota's
// out-of-quota error, or an admission rejection (admission.RejectionOf),
// ErrSlowSender among them.
// A refused request needs nothing more.
func (in *Intake) Accept(ctx context.Context, r *Request) (*Handle, error) {
	var f facts
	l := criticality.Default
	h, err := in.accept(ctx, r, &f, &l)
	if in.tracer != nil {
		if err != nil {
			in.traceRefusal(ctx, r, l, &f, err)
		} else {
			h.tr = &traced{t: in.tracer, ctx: ctx, path: r.Path, clientType: f.clientType, trusted: f.trusted}
		}
	}
	return h, err
}

// accept is Accept, filling f and the request's level as it learns them.
func (in *Intake) accept(ctx context.Context, r *Request, f *facts, lvl *criticality.Level) (*Handle, error) {
	slow := false // a slow sender's request, refused in shadow
	if r.Conn != nil && in.admission != nil && !r.HealthCheck {
		var err error
		if f.probation, err = in.refuseSlow(ctx, r.Conn, in.shadow.Has(shadow.Connection)); err != nil {
			if !in.shadow.Has(shadow.Connection) {
				return nil, err
			}
			slow = true
		}
	}
	r.Peer.ForwardedClientCert = r.last(keyXFCC)
	r.Peer = in.trust.Resolve(r.Peer) // behind a trusted proxy, its caller
	f.trusted = in.trust.Trusted(r.Peer)
	er := edge.Request{Trusted: f.trusted, Host: r.Host, Path: r.Path, Group: r.Group}
	if f.trusted {
		dropFolded(r.Header, in.classifier.Observer())
		r.trustedFacts(&er, f)
	} else {
		strip(r.Header, in.classifier.Observer())
	}
	if f.customer == "" && in.customerID && len(r.Peer.Identities) > 0 && len(r.Peer.Identities[0]) <= wire.CustomerMaxLen {
		f.customer = quota.Customer(r.Peer.Identities[0])
	}
	d := in.classifier.Classify(&er)
	*lvl = d.Level
	if r.HealthCheck {
		return newHandle(ctx, d.Level, *f), nil
	}
	if slow {
		in.shadows(shadow.Connection, "slow-sender", d.Level, &f.shadowed)
	}
	if in.iso != nil {
		if ct := in.iso.ClientFor(r.Host); ct != "" {
			f.clientType = ct
			if in.iso.RouteOf(ct) == isolate.BlackHole && !in.shadows(shadow.Isolation, "black-hole", d.Level, &f.shadowed) {
				return nil, isolate.ErrBlackHoled
			}
			ctx = isolate.NewContext(ctx, ct)
		}
	}
	level, cancel := d.Level, context.CancelFunc(nil)
	if d.Decay.After > 0 || f.decay != "" {
		ctx, cancel, level = in.decay(ctx, d, f.decay)
		*lvl = level
	}
	h, err := in.admit(ctx, level, *f, r, cancel != nil)
	if err != nil {
		if cancel != nil {
			cancel()
		}
		return nil, err
	}
	if cancel != nil {
		h.x.cancel = cancel
	}
	return h, nil
}

// decay starts the matching rule's decay, or believes a trusted upstream's
// (only when the header rule decided), and returns the context, the cancel
// func of a rule that cancels at its decay (it sets a deadline), and the
// request's current level.
func (in *Intake) decay(ctx context.Context, d edge.Decision, wireDecay string) (context.Context, context.CancelFunc, criticality.Level) {
	switch {
	case d.Decay.Cancel:
		ctx, cancel := context.WithDeadline(ctx, in.clock.Now().Add(d.Decay.After))
		return ctx, cancel, d.Level
	case d.Decay.After > 0:
		return criticality.WithDecay(ctx, criticality.Decay{At: in.clock.Now().Add(d.Decay.After), To: d.Decay.To}), nil, d.Level
	case wireDecay != "" && d.Rule == edge.Header:
		now := in.clock.Now()
		if dc, err := criticality.ParseDecay(wireDecay, now); err == nil {
			ctx = criticality.WithDecay(ctx, dc)
			if dc.To < d.Level && !now.Before(dc.At) {
				return ctx, nil, dc.To
			}
		}
	}
	return ctx, nil, d.Level
}

// admit reserves quota and asks admission control; a refusal allocates
// nothing (the ticket lives on the stack until the request is admitted).
// r is the request (its connection); cancels says the Handle will hold a
// decay's cancel func.
func (in *Intake) admit(ctx context.Context, l criticality.Level, f facts, r *Request, cancels bool) (h *Handle, err error) {
	var res quota.Reservation
	enf, ctl := in.quota, in.admission // nil for a request one of them would refuse in shadow
	if in.skips(shadow.Quota, f.shadowed) {
		enf = nil
	}
	if enf != nil {
		var err error
		if res, err = enf.Reserve(f.customer, l); err != nil {
			if !in.shadows(shadow.Quota, "out-of-quota", l, &f.shadowed) {
				return nil, err
			}
			enf = nil
		}
	}
	var t admission.Ticket
	if in.skips(shadow.Admission, f.shadowed) {
		ctl = nil
	}
	if ctl != nil {
		deadline, _ := ctx.Deadline()
		var a admission.Arrival
		if c := r.Conn; c != nil && in.connShare > 0 && c.waiting.Load() >= in.connShare {
			a |= admission.OverShare
		}
		if in.peers != nil && !f.trusted && r.Peer.Addr.IsValid() {
			over, counted := in.peers.enter(r.Peer.Addr, in.peerShare)
			if over {
				a |= admission.OverShare
			}
			if counted {
				defer func() {
					if h != nil && h.x != nil && h.x.ctl != nil {
						h.x.peer.p, h.x.peer.addr = in.peers, r.Peer.Addr
						h.x.peer.counted.Store(true)
					} else {
						in.peers.leave(r.Peer.Addr)
					}
				}()
			}
		}
		if r.RunQueued {
			a |= admission.RunQueued
		}
		if in.shadow.Has(shadow.Admission) {
			a |= admission.Shadow
		}
		if err := ctl.Arrive(&t, l, f.attempt, deadline, a); err != nil {
			if enf != nil {
				enf.Cancel(f.customer, res)
			}
			if !in.shadowsAdmission(err, l, &f.shadowed) {
				return nil, err
			}
			ctl, enf = nil, nil
		}
	}
	if ctl == nil && enf == nil && !cancels {
		return newHandle(ctx, l, f), nil
	}
	h = newAdmittedHandle(ctx, l, f)
	x := h.x
	x.ctl, x.ticket, x.clk = ctl, t, in.clock
	if enf != nil {
		x.quota, x.meter, x.reserved = enf, in.meter, res
	}
	if ctl != nil && in.shadow.Has(shadow.Admission) {
		x.shadow = in
	}
	if c := r.Conn; c != nil && ctl != nil {
		in.mark(&x.conn, c, f)
	}
	return h, nil
}

// mark counts an admitted request in its connection's waiting count, and
// in its probation count if the connection is on probation.
func (in *Intake) mark(m *connMark, c *Conn, f facts) {
	m.c, m.maxStalls = c, in.maxConnStalls
	if in.penaliseTrusted || !f.trusted {
		m.in = in
	}
	m.waiting.Store(true)
	c.waiting.Add(1)
	if f.probation {
		m.probation.Store(true)
		c.probation.Add(1)
	}
}
