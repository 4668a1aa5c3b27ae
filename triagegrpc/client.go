package triagegrpc

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/wire"
)

// Client holds the client side of the adapter. It is immutable and safe for
// concurrent use; its only state is a table of the 16 possible header sets
// (4 criticalities x 4 attempt values), built once.
type Client struct {
	md        *headerTable
	callCreds grpc.CallOption
}

// NewClient returns a Client.
func NewClient() *Client {
	t := newHeaderTable()
	return &Client{md: t, callCreds: grpc.PerRPCCredentials(t)}
}

// DialOptions returns the grpc.DialOptions that install the client side on a
// connection; pass them to grpc.NewClient. This is the cheapest way: the
// transport asks for the headers of each call and gets a prebuilt map, so
// propagation allocates nothing in triage.
func (c *Client) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithPerRPCCredentials(c.md),
		grpc.WithChainUnaryInterceptor(c.unary(false)),
		grpc.WithChainStreamInterceptor(c.stream(false)),
	}
}

// PerRPCCredentials returns the header source DialOptions installs, for
// callers assembling their own dial options.
func (c *Client) PerRPCCredentials() credentials.PerRPCCredentials { return c.md }

// UnaryInterceptor returns a standalone unary client interceptor, for
// connections set up without DialOptions: it writes the context's
// criticality (criticality.Of) and outgoing attempt counter
// (attempt.Outgoing) into the call's headers, and decodes overload outcomes
// into *RemoteError. Triage keys already in the outgoing metadata (e.g. a
// proxy forwarding its incoming metadata) are removed, never sent twice.
func (c *Client) UnaryInterceptor() grpc.UnaryClientInterceptor { return c.unary(true) }

// StreamInterceptor returns a standalone streaming client interceptor that
// does for streams what UnaryInterceptor does for unary calls.
func (c *Client) StreamInterceptor() grpc.StreamClientInterceptor { return c.stream(true) }

func (c *Client) unary(addCreds bool) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx = dropForwarded(ctx)
		if addCreds {
			opts = append(opts, c.callCreds)
		}
		return fromWire(invoker(ctx, method, req, reply, cc, opts...))
	}
}

func (c *Client) stream(addCreds bool) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		ctx = dropForwarded(ctx)
		if addCreds {
			opts = append(opts, c.callCreds)
		}
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, fromWire(err)
		}
		return &clientStream{ClientStream: cs}, nil
	}
}

type clientStream struct{ grpc.ClientStream }

func (s *clientStream) RecvMsg(m any) error { return fromWire(s.ClientStream.RecvMsg(m)) }

func (s *clientStream) SendMsg(m any) error { return fromWire(s.ClientStream.SendMsg(m)) }

// dropForwarded removes triage keys from the outgoing metadata, if any are
// there; the header table supplies the real ones. The check does not
// allocate when there are none.
func dropForwarded(ctx context.Context) context.Context {
	if metadata.ValueFromOutgoingContext(ctx, wire.CriticalityKey) == nil &&
		metadata.ValueFromOutgoingContext(ctx, wire.AttemptKey) == nil {
		return ctx
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	for k := range md {
		if wire.IsTriage(k) {
			delete(md, k)
		}
	}
	return metadata.NewOutgoingContext(ctx, md)
}

// headerTable is a credentials.PerRPCCredentials that hands the transport
// the triage headers of each call from a prebuilt, read-only table.
type headerTable [criticality.NumLevels][attempt.MaxAttempts + 1]map[string]string

func newHeaderTable() *headerTable {
	var t headerTable
	for l := range t {
		for n := range t[l] {
			t[l][n] = map[string]string{
				wire.CriticalityKey: criticality.Level(l).String(),
				wire.AttemptKey:     attempt.Format(n),
			}
		}
	}
	return &t
}

// GetRequestMetadata implements credentials.PerRPCCredentials. The returned
// map is shared and must not be modified; grpc-go copies it.
func (t *headerTable) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	return t[criticality.Of(ctx)][attempt.Outgoing(ctx)], nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials: triage
// headers are not secrets and flow over insecure connections too.
func (t *headerTable) RequireTransportSecurity() bool { return false }

var _ credentials.PerRPCCredentials = (*headerTable)(nil)
