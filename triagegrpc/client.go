package triagegrpc

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/wire"
)

// Client holds the client side of the adapter: propagation of criticality
// and the attempt counter, and the client-side defences of package retry
// (adaptive throttling, up to three attempts, the per-client retry budget,
// backoff, "overloaded; don't retry" upward).
//
// The throttle and the budget keep statistics of one backend service, so
// use one Client per backend service (per target you dial), shared by all
// connections to it. A Client is safe for concurrent use; its memory is
// fixed: a table of the 16 possible header sets (4 criticalities x 4
// attempt values), built once, and the Policy's windows.
//
// Headers: every call carries triage-criticality; triage-attempt is sent
// only on retries (a missing counter means 0), which keeps first attempts
// one header lighter.
//
// # Retries and grpc-go's own retry policy
//
// Only one layer may retry a call. DialOptions installs the Client's
// interceptors with grpc.WithDisableRetry, so a retryPolicy in the service
// config is ignored on that connection and the Client's Policy alone retries
// (use retry.WithRetryable to retry other errors, such as a failed
// connection). The standalone UnaryInterceptor cannot turn grpc-go's retries
// off; for a method whose service config has a retryPolicy it sends each
// call once through the throttle and leaves retrying to grpc-go. Streams are
// throttled and counted but never retried by triage: a stream's messages
// cannot be replayed.
type Client struct {
	headers *headerTable
	policy  *retry.Policy
	idle    time.Duration
	clock   clock.Clock
	iso     *isolate.Table
	sacPol  *retry.Policy // for client types routed to the sacrificial backends
	// gens holds, per client type, a context cancelled when the type's
	// route changes: calls in flight of that type are cancelled with it.
	gens   atomic.Pointer[map[string]routeGen]
	gensMu sync.Mutex // held to replace gens
}

type routeGen struct {
	route  isolate.Route
	ctx    context.Context
	cancel context.CancelFunc
}

// ClientOption configures a Client.
type ClientOption interface{ applyClient(*clientConfig) }

type clientConfig struct {
	policy   *retry.Policy
	noPolicy bool
	idle     time.Duration
	clock    clock.Clock
	iso      *isolate.Table
	sacPol   *retry.Policy
}

type clientOptionFunc func(*clientConfig)

func (f clientOptionFunc) applyClient(c *clientConfig) { f(c) }

// WithPolicy sets the retry and throttling policy. Default: retry.New()
// with the book's defaults (K = 2 over two minutes, 3 attempts, 10% budget).
func WithPolicy(p *retry.Policy) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.policy, c.noPolicy = p, p == nil })
}

// WithoutPolicy makes the Client propagate criticality and decode outcomes
// only: no throttling, no retries.
func WithoutPolicy() ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.policy, c.noPolicy = nil, true })
}

// DefaultIdleTimeout is how long a connection set up with a Client's
// DialOptions may carry no call before it goes idle: its connections are
// closed, and the next call opens them again without failing (SRE book ch.
// 21, "Load from Connections": an idle client's connections and health
// checks cost its backends CPU and memory for nothing). Five minutes: long
// enough that a client calling every few seconds or minutes keeps its
// connections, so that only the truly idle pay a reconnection (a
// round trip, and a TLS handshake) on their next call.
const DefaultIdleTimeout = 5 * time.Minute

// WithIdleTimeout sets how long a connection may carry no call before it
// goes idle (grpc.WithIdleTimeout). Default DefaultIdleTimeout; 0 never.
func WithIdleTimeout(d time.Duration) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.idle = max(d, 0) })
}

// WithClientClock sets the clock that reads the time left before a
// request's criticality decays (criticality.WithDecay): each call carries
// the current criticality and, while the decay is ahead, its time left in
// triage-criticality-decay. Default clock.Real().
func WithClientClock(clk clock.Clock) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.clock = clk })
}

// WithClientIsolation gives the calls of client types that t routes to the
// sacrificial backends (lb.WithIsolation) a policy of
// their own, sacrificial (nil: retry.New() with the book's defaults):
// adaptive throttling estimates how much the backends it sends to accept,
// and the sacrificial backends, which may be overloaded, must not throttle
// the other client types' calls to the rest, nor spend their retry
// budget. Without a Policy (WithoutPolicy) it changes nothing. The Client
// subscribes to t for the life of the process (isolate.Table.Subscribe):
// make one per backend service, as usual, not one per call.
func WithClientIsolation(t *isolate.Table, sacrificial *retry.Policy) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.iso, c.sacPol = t, sacrificial })
}

// NewClient returns a Client.
func NewClient(opts ...ClientOption) *Client {
	cfg := clientConfig{idle: DefaultIdleTimeout}
	for _, o := range opts {
		o.applyClient(&cfg)
	}
	if cfg.policy == nil && !cfg.noPolicy {
		p, err := retry.New()
		if err != nil {
			panic("triagegrpc: default retry policy: " + err.Error()) // the defaults are valid
		}
		cfg.policy = p
	}
	c := &Client{headers: newHeaderTable(), policy: cfg.policy, idle: cfg.idle, clock: clock.OrReal(cfg.clock)}
	if cfg.iso != nil && cfg.policy != nil {
		c.iso, c.sacPol = cfg.iso, cfg.sacPol
		if c.sacPol == nil {
			p, err := retry.New()
			if err != nil {
				panic("triagegrpc: default retry policy: " + err.Error()) // the defaults are valid
			}
			c.sacPol = p
		}
		c.gens.Store(&map[string]routeGen{})
		c.iso.Subscribe(c.routesChanged) // for the life of the process: a Client is long-lived
	}
	return c
}

// Policy returns the Client's policy, nil without one.
func (c *Client) Policy() *retry.Policy { return c.policy }

// routesChanged cancels the calls in flight of every client type whose
// route changed: a client type moved to the sacrificial backends (or
// black-holed) leaves the shared ones at once, with the requests it has
// queued there.
func (c *Client) routesChanged() {
	c.gensMu.Lock()
	defer c.gensMu.Unlock()
	old := *c.gens.Load()
	next := make(map[string]routeGen, len(old))
	for ct, g := range old {
		if c.iso.RouteOf(ct) != g.route {
			g.cancel()
			continue
		}
		next[ct] = g
	}
	c.gens.Store(&next)
}

// isolated returns ctx cancelled when the route of its client type
// changes, and a func to call when the call ends. A call without a client
// type is left alone.
func (c *Client) isolated(ctx context.Context) (context.Context, func()) {
	ct := isolate.ClientOf(ctx)
	if c.iso == nil || ct == "" {
		return ctx, func() {}
	}
	g, ok := (*c.gens.Load())[ct]
	if !ok {
		g = c.newGen(ct)
	}
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(g.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// newGen adds ct's generation (bounded by isolate.MaxClients: a client
// type the table does not name gets none).
func (c *Client) newGen(ct string) routeGen {
	c.gensMu.Lock()
	defer c.gensMu.Unlock()
	cur := *c.gens.Load()
	if g, ok := cur[ct]; ok {
		return g
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := routeGen{route: c.iso.RouteOf(ct), ctx: ctx, cancel: cancel}
	if len(cur) >= isolate.MaxClients {
		return g
	}
	next := make(map[string]routeGen, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	next[ct] = g
	c.gens.Store(&next)
	return g
}

// policyFor returns the policy of ctx's call: the sacrificial route's for
// a client type routed there (WithClientIsolation), else the Client's.
func (c *Client) policyFor(ctx context.Context) *retry.Policy {
	if c.iso != nil && c.iso.RouteOf(isolate.ClientOf(ctx)) == isolate.Sacrificial {
		return c.sacPol
	}
	return c.policy
}

// DialOptions returns the grpc.DialOptions that install the client side on a
// connection; pass them to grpc.NewClient. With a Policy it includes
// grpc.WithDisableRetry (see the type's doc).
func (c *Client) DialOptions() []grpc.DialOption {
	opts := []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(c.unary(false)),
		grpc.WithChainStreamInterceptor(c.stream(false)),
		grpc.WithIdleTimeout(c.idle),
	}
	if c.policy != nil {
		opts = append(opts, grpc.WithDisableRetry())
	}
	return opts
}

// UnaryInterceptor returns a standalone unary client interceptor, for
// connections set up without DialOptions (it does not turn off grpc-go's
// retries; see the type's doc): it writes the context's
// criticality (criticality.Of) and outgoing attempt counter
// (attempt.Outgoing) into the call's headers, runs the call under the
// Client's Policy, and decodes overload outcomes into *RemoteError. Triage
// keys already in the outgoing metadata (e.g. a proxy forwarding its
// incoming metadata) are removed, never sent twice.
func (c *Client) UnaryInterceptor() grpc.UnaryClientInterceptor { return c.unary(true) }

// StreamInterceptor returns a standalone streaming client interceptor that
// does for streams what UnaryInterceptor does for unary calls, without
// retries.
func (c *Client) StreamInterceptor() grpc.StreamClientInterceptor { return c.stream(true) }

func (c *Client) unary(standalone bool) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx = dropForwarded(ctx, opts)
		t := cost.TrackerFrom(ctx) // the handler's request, if any, waits meanwhile
		t.Wait()
		defer t.Resume()
		if c.policy == nil {
			return fromWire(invoker(c.outgoing(ctx), method, req, reply, cc, opts...))
		}
		call := func(ctx context.Context) error {
			return fromWire(invoker(c.outgoing(ctx), method, req, reply, cc, opts...))
		}
		ctx, end := c.isolated(ctx)
		defer end()
		p := c.policyFor(ctx)
		if standalone && cc != nil && cc.GetMethodConfig(method).RetryPolicy != nil {
			return toWire(p.DoOnce(ctx, call)) // grpc-go retries this method
		}
		return toWire(p.Do(ctx, call))
	}
}

func (c *Client) stream(standalone bool) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		ctx = dropForwarded(ctx, opts)
		var single retry.Single
		if c.policy != nil {
			var err error
			if single, err = c.policyFor(ctx).Start(ctx); err != nil {
				return nil, toWire(err)
			}
		}
		cs, err := streamer(c.outgoing(ctx), desc, cc, method, opts...)
		if err != nil {
			err = fromWire(err)
			single.Finish(err)
			return nil, err
		}
		return &clientStream{ClientStream: cs, single: single}, nil
	}
}

// clientStream decodes outcomes and reports the stream's first answer (its
// first received message or error) to the Policy.
type clientStream struct {
	grpc.ClientStream
	single   retry.Single
	answered atomic.Bool
}

func (s *clientStream) RecvMsg(m any) error {
	err := fromWire(s.ClientStream.RecvMsg(m))
	if !s.answered.Swap(true) {
		s.single.Finish(err)
	}
	return err
}

func (s *clientStream) SendMsg(m any) error { return fromWire(s.ClientStream.SendMsg(m)) }

// toWire gives an outcome the Policy created (a local rejection, or giving
// up after retries) a gRPC status, so that status.Code and errors.Is both
// work on it; errors that already carry a status are returned unchanged.
func toWire(err error) error {
	oe, ok := err.(*outcome.Error)
	if !ok {
		return err
	}
	return &RemoteError{Outcome: oe, st: Status(oe)}
}

// dropForwarded removes every triage key (wire.IsTriage) from the
// outgoing metadata, if any is there; the header table supplies the real
// ones. A call without outgoing metadata costs nothing; one with it pays
// for a copy, the only way grpc-go lists outgoing keys, unless the caller
// is triage's Proxy, which built it without triage keys (cleanOutgoing).
func dropForwarded(ctx context.Context, opts []grpc.CallOption) context.Context {
	for _, o := range opts {
		if _, ok := o.(cleanOutgoing); ok {
			return ctx
		}
	}
	md, ok := metadata.FromOutgoingContext(ctx)
	if !ok {
		return ctx
	}
	found := false
	for k := range md {
		if wire.IsTriage(k) {
			delete(md, k)
			found = true
		}
	}
	if !found {
		return ctx
	}
	return metadata.NewOutgoingContext(ctx, md)
}

// cleanOutgoing is the call option of the Proxy's calls, whose outgoing
// metadata it filtered of triage keys itself.
type cleanOutgoing struct{ grpc.EmptyCallOption }

// headerTable holds, per criticality and attempt counter, the key/value
// pairs of the triage headers, built once and never modified.
type headerTable [criticality.NumLevels][attempt.MaxAttempts + 1][]string

func newHeaderTable() *headerTable {
	var t headerTable
	for l := range t {
		for n := range t[l] {
			t[l][n] = []string{wire.CriticalityKey, criticality.Level(l).String()}
			if n > 0 {
				t[l][n] = append(t[l][n], wire.AttemptKey, attempt.Format(n))
			}
		}
	}
	return &t
}

// outgoing adds the triage headers of ctx (criticality.Of,
// attempt.Outgoing, and quota.CustomerOf when there is one) to its
// outgoing metadata. ctx must have been through dropForwarded.
func (c *Client) outgoing(ctx context.Context) context.Context {
	level := criticality.Of(ctx)
	decay := ""
	if dc, ok := criticality.DecayOf(ctx); ok {
		now := c.clock.Now()
		if level, _ = criticality.Current(ctx, now); level > dc.To {
			decay = criticality.FormatDecay(dc, now)
		}
	}
	kv := c.headers[level][attempt.Outgoing(ctx)]
	if decay != "" {
		kv = append(kv[:len(kv):len(kv)], wire.DecayKey, decay)
	}
	if cu := quota.CustomerOf(ctx); cu != "" && len(cu) <= wire.CustomerMaxLen {
		kv = append(kv[:len(kv):len(kv)], wire.CustomerKey, cu)
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}
