package egress

import (
	"context"

	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/wire"
)

// Call is one outgoing call, from Caller.Begin to End: its context, the
// policy of its client type, and whether its host receives triage's keys.
// It is a small value, used by the goroutine that made the call.
type Call struct {
	c        *Caller
	ctx      context.Context
	policy   *retry.Policy
	internal bool
	cancel   context.CancelFunc // isolation's; nil without
	refused  error              // isolate.ErrBlackHoled for a black-holed client type
}

// Begin starts an outgoing call made with ctx (the calling request's
// context, or any other) to host: for a client type the isolation table
// names (isolate.ClientOf), its route's policy, a context that carries the
// route (isolate.RouteFrom, which the balancer follows) and is cancelled
// when that route changes (WithIsolation), and, for a black-holed one,
// isolate.ErrBlackHoled from Do and Start without an attempt. Call End when the call is
// over. Begin allocates only for a client type under isolation. On a nil
// Caller it begins a call without a policy to a host that is not
// internal.
func (c *Caller) Begin(ctx context.Context, host string) Call {
	if c == nil {
		return Call{ctx: ctx}
	}
	if c.iso != nil {
		return c.beginIsolated(ctx, host)
	}
	return Call{c: c, ctx: ctx, policy: c.policy, internal: c.hosts.all || c.hosts.match(host)}
}

// beginIsolated is Begin for a Caller that follows an isolation table.
func (c *Caller) beginIsolated(ctx context.Context, host string) Call {
	call := Call{c: c, ctx: ctx, policy: c.policy, internal: c.hosts.match(host)}
	ct := isolate.ClientOf(ctx)
	if ct == "" {
		return call
	}
	route := c.iso.RouteOf(ct)
	switch route {
	case isolate.Sacrificial:
		call.policy = c.sacPol
	case isolate.BlackHole:
		call.refused = isolate.ErrBlackHoled
	}
	g := c.generation(ct)
	call.ctx, call.cancel = context.WithCancel(isolate.NewRouteContext(ctx, route))
	stop := context.AfterFunc(g.ctx, call.cancel)
	// However the call's context ends (End, the caller's cancellation, a
	// route change), the generation forgets it: a stream its caller
	// abandons is not held.
	context.AfterFunc(call.ctx, func() { stop() })
	return call
}

// Context returns the call's context: Begin's, or a child of it that a
// route change cancels.
func (call Call) Context() context.Context { return call.ctx }

// End ends the call; calling it again does nothing.
func (call Call) End() {
	if call.cancel != nil {
		call.cancel()
	}
}

// Do runs the call's attempts under its policy, each with a context that
// carries its attempt counter (attempt.Outgoing): up to the policy's
// attempts (retry.Policy.Do), or one attempt when once is true, for a call
// that cannot be replayed or that another layer retries
// (retry.Policy.DoOnce). Without a policy it runs one attempt, unthrottled.
// Meanwhile the calling request, if it is a triage request, waits on its
// call (cost.Tracker): its CPU is not charged and its slot may serve
// others. Do returns the last attempt's error, or the policy's
// *outcome.Error when it gave up.
func (call *Call) Do(once bool, attempt func(ctx context.Context) error) error {
	if call.refused != nil {
		return call.refused
	}
	t := cost.TrackerFrom(call.ctx)
	t.Wait()
	defer t.Resume()
	switch {
	case call.policy == nil:
		return attempt(call.ctx)
	case once:
		return call.policy.DoOnce(call.ctx, attempt)
	}
	return call.policy.Do(call.ctx, attempt)
}

// Start begins a stream: a single attempt, throttled and counted as Do's
// are (retry.Policy.Start), whose first answer the adapter reports with
// the returned Single's Finish. Without a policy it does nothing. Streams
// are never retried: their messages cannot be replayed.
func (call *Call) Start() (retry.Single, error) {
	if call.refused != nil {
		return retry.Single{}, call.refused
	}
	if call.policy == nil {
		return retry.Single{}, nil
	}
	return call.policy.Start(call.ctx)
}

// Keys is what one attempt tells the backend, each in its wire key
// (package wire).
type Keys struct {
	// Level is the criticality as of now: criticality.Of, or the level it
	// has decayed to.
	Level criticality.Level
	// Attempt is the attempt counter: 0 on a first try, when it is not
	// sent (a missing counter means 0), 1 and 2 on retries.
	Attempt int
	// Decay is criticality.FormatDecay while a decay is ahead, "" if none.
	Decay string
	// Customer is quota.CustomerOf, "" if none or longer than
	// wire.CustomerMaxLen.
	Customer string
}

// Pairs appends k's wire form to kv as name/value pairs, with wire's
// lower-case names: the criticality always; the attempt counter past the
// first try, the decay and the customer when k has them. It is the one
// encoding of Keys: gRPC metadata, HTTP headers (wire.Header gives the
// canonical spelling) and Envoy's header mutations are written from it.
// It allocates only when kv has no room.
func (k Keys) Pairs(kv []string) []string {
	kv = append(kv, wire.CriticalityKey, k.Level.String())
	if k.Attempt > 0 {
		kv = append(kv, wire.AttemptKey, attempt.Format(k.Attempt))
	}
	if k.Decay != "" {
		kv = append(kv, wire.DecayKey, k.Decay)
	}
	if k.Customer != "" {
		kv = append(kv, wire.CustomerKey, k.Customer)
	}
	return kv
}

// Keys returns what an attempt made with ctx (the context Do gave it, or
// the call's) carries now, and false if the call's host is not internal
// (WithInternal): such an attempt carries no triage key at all, and the
// adapter strips any already in its metadata or headers. It does not
// allocate unless a decay is ahead.
func (call *Call) Keys(ctx context.Context) (Keys, bool) {
	if !call.internal {
		return Keys{}, false
	}
	k := Keys{Level: criticality.Of(ctx), Attempt: attempt.Outgoing(ctx)}
	if dc, ok := criticality.DecayOf(ctx); ok {
		now := call.c.clock.Now()
		if k.Level, _ = criticality.Current(ctx, now); k.Level > dc.To {
			k.Decay = criticality.FormatDecay(dc, now)
		}
	}
	if cu := quota.CustomerOf(ctx); len(cu) <= wire.CustomerMaxLen {
		k.Customer = cu
	}
	return k, true
}
