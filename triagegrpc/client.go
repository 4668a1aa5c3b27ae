package triagegrpc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/triagegrpc/internal/forward"
	"github.com/triagehq/triage/wire"
)

// Client is the gRPC binding of an egress.Caller: it writes each call's
// keys (egress.Call.Keys) into its metadata, runs unary calls under the
// Caller's policy and streams as single attempts, and decodes overload
// outcomes into *RemoteError. What a call carries, to which hosts, and
// under which policy is the Caller's (package egress), the same for every
// transport; the host of a call is its connection's dial target's
// (grpc.ClientConn.Target: "dns:///api.svc:443" is "api.svc", a unix
// socket has none).
//
// Use one Client per backend service, as one Caller. A Client is safe for
// concurrent use; its memory is fixed: a table of the 16 possible header
// sets (4 criticalities x 4 attempt values), built once.
//
// Headers: every call to an internal host carries triage-criticality;
// triage-attempt only on retries (a missing counter means 0).
//
// # Retries and grpc-go's own retry policy
//
// Only one layer may retry a call. DialOptions installs the Client's
// interceptors with grpc.WithDisableRetry when the Caller has a policy, so
// a retryPolicy in the service config is ignored on that connection and
// the Caller's policy alone retries (use retry.WithRetryable to retry
// other errors, such as a failed connection). With
// WithServiceConfigRetries grpc-go's retries stay on: for a method whose
// service config has a retryPolicy the Client sends each call once through
// the throttle and leaves retrying to grpc-go. Streams are throttled and
// counted but never retried by triage: a stream's messages cannot be
// replayed.
type Client struct {
	eg     *egress.Caller
	idle   time.Duration
	keepSC bool // WithServiceConfigRetries
}

// ClientOption configures a Client.
type ClientOption interface{ applyClient(*clientConfig) }

type clientConfig struct {
	idle   time.Duration
	keepSC bool
}

type clientOptionFunc func(*clientConfig)

func (f clientOptionFunc) applyClient(c *clientConfig) { f(c) }

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

// WithServiceConfigRetries keeps the service config's own retryPolicy and
// hedgingPolicy on connections set up with DialOptions: a method that has
// one is sent once through the Caller's throttle and retried by grpc-go
// alone; the others are retried by the Caller. Use it only where the
// service config's policy must stay: one retrying layer is the point (SRE
// book ch. 21: retries at every layer of a stack multiply, 3 attempts at
// each of three layers are 27 at the bottom). Default: off.
func WithServiceConfigRetries() ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.keepSC = true })
}

// NewClient returns the Client of caller, or an error for a nil caller or
// option.
func NewClient(caller *egress.Caller, opts ...ClientOption) (*Client, error) {
	if caller == nil {
		return nil, errors.New("triagegrpc: NewClient: nil egress.Caller")
	}
	cfg := clientConfig{idle: DefaultIdleTimeout}
	for i, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("triagegrpc: NewClient: option %d is nil", i)
		}
		o.applyClient(&cfg)
	}
	return &Client{eg: caller, idle: cfg.idle, keepSC: cfg.keepSC}, nil
}

// Caller returns the Client's egress.Caller.
func (c *Client) Caller() *egress.Caller { return c.eg }

// DialOptions returns the grpc.DialOptions that install the client side on a
// connection; pass them to grpc.NewClient. With a Policy it includes
// grpc.WithDisableRetry, unless WithServiceConfigRetries (see the type's
// doc).
func (c *Client) DialOptions() []grpc.DialOption {
	opts := []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(c.unary(c.keepSC)),
		grpc.WithChainStreamInterceptor(c.stream()),
		grpc.WithIdleTimeout(c.idle),
	}
	if c.eg.Policy() != nil && !c.keepSC {
		opts = append(opts, grpc.WithDisableRetry())
	}
	return opts
}

func (c *Client) unary(keepSC bool) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		call := c.eg.Begin(dropForwarded(ctx, opts), targetHost(cc))
		defer call.End()
		// grpc-go retries a method whose service config has a retryPolicy
		// when its retries are kept.
		once := keepSC && cc != nil && cc.GetMethodConfig(method).RetryPolicy != nil
		return toWire(call.Do(once, func(ctx context.Context) error {
			return fromWire(invoker(c.outgoing(ctx, &call), method, req, reply, cc, opts...))
		}))
	}
}

func (c *Client) stream() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		call := c.eg.Begin(dropForwarded(ctx, opts), targetHost(cc))
		single, err := call.Start()
		if err != nil {
			call.End()
			return nil, toWire(err)
		}
		cs, err := streamer(c.outgoing(call.Context(), &call), desc, cc, method, opts...)
		if err != nil {
			err = fromWire(err)
			single.Finish(err)
			call.End()
			return nil, err
		}
		return &clientStream{ClientStream: cs, single: single, call: call}, nil
	}
}

// targetHost returns the host of cc's dial target: "dns:///api.svc:443"
// and "api.svc:443" give "api.svc:443" (egress ignores the port); a
// target without a host (a unix socket) gives "".
func targetHost(cc *grpc.ClientConn) string {
	if cc == nil {
		return ""
	}
	t := cc.Target()
	scheme, rest, ok := strings.Cut(t, "://")
	if !ok {
		if scheme, rest, ok = strings.Cut(t, ":"); ok && (scheme == "unix" || scheme == "unix-abstract") {
			return ""
		}
		return t
	}
	if scheme == "unix" || scheme == "unix-abstract" {
		return ""
	}
	_, endpoint, _ := strings.Cut(rest, "/") // after the authority, if any
	return endpoint
}

// clientStream decodes outcomes and reports the stream's first answer (its
// first received message or error) to the Policy.
type clientStream struct {
	grpc.ClientStream
	single   retry.Single
	call     egress.Call
	answered atomic.Bool
	ended    atomic.Bool
}

func (s *clientStream) RecvMsg(m any) error {
	err := fromWire(s.ClientStream.RecvMsg(m))
	if !s.answered.Swap(true) {
		s.single.Finish(err)
	}
	if err != nil && !s.ended.Swap(true) {
		s.call.End() // the stream is over: its isolation ends with it
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
// is the batch proxy, which built it without triage keys (forward.Clean).
func dropForwarded(ctx context.Context, opts []grpc.CallOption) context.Context {
	for _, o := range opts {
		if _, ok := o.(forward.Clean); ok {
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

// outgoing adds the triage keys of an attempt of call made with ctx
// (egress.Call.Keys) to ctx's outgoing metadata. ctx must have been
// through dropForwarded.
func (c *Client) outgoing(ctx context.Context, call *egress.Call) context.Context {
	k, ok := call.Keys(ctx)
	if !ok {
		return ctx
	}
	var buf [8]string
	return metadata.AppendToOutgoingContext(ctx, k.Pairs(buf[:0])...)
}
