// Package relay is a tiny gRPC service for triage's demo and loopback tests:
// each tier records the criticality and attempt counter it received, then
// relays the call to the next tier, so a test can see what arrived at every
// hop. It uses a hand-written service descriptor and the well-known
// StringValue message, so it needs no generated code.
package relay

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/criticality"
)

// ServiceName and the full method names.
const (
	ServiceName  = "triage.demo.Relay"
	CallMethod   = "/" + ServiceName + "/Call"
	StreamMethod = "/" + ServiceName + "/Stream"
)

// Arrival is what one tier saw of one request.
type Arrival struct {
	Tier        string
	Criticality criticality.Level
	Attempt     int
	Body        string
}

func (a Arrival) String() string {
	return fmt.Sprintf("%s:%v/%d", a.Tier, a.Criticality, a.Attempt)
}

// Tier is one server of the stack. Fields may be set before serving and are
// read-only afterwards.
type Tier struct {
	// Name appears in the trace.
	Name string
	// Next is the connection to the next tier; nil for the last tier.
	Next grpc.ClientConnInterface
	// Override, if set, may change the context of the outgoing call (e.g. to
	// override its criticality).
	Override func(ctx context.Context, body string) context.Context
	// Fail, if set, may return an error instead of serving.
	Fail func(ctx context.Context, body string) error
	// Observe, if set, is called with every arrival.
	Observe func(Arrival)

	mu       sync.Mutex
	arrivals []Arrival // bounded by maxArrivals
}

const maxArrivals = 4096

// Arrivals returns a copy of the arrivals recorded so far (the most recent
// 4096).
func (t *Tier) Arrivals() []Arrival {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Arrival(nil), t.arrivals...)
}

func (t *Tier) record(ctx context.Context, body string) Arrival {
	a := Arrival{Tier: t.Name, Criticality: criticality.Of(ctx), Attempt: attempt.Incoming(ctx), Body: body}
	t.mu.Lock()
	if len(t.arrivals) >= maxArrivals {
		t.arrivals = t.arrivals[1:]
	}
	t.arrivals = append(t.arrivals, a)
	t.mu.Unlock()
	if t.Observe != nil {
		t.Observe(a)
	}
	return a
}

// Call serves one request: it records the arrival, then relays to Next.
// The response is the trace "tier:LEVEL/attempt > next:LEVEL/attempt ...".
func (t *Tier) Call(ctx context.Context, body string) (string, error) {
	a := t.record(ctx, body)
	if t.Fail != nil {
		if err := t.Fail(ctx, body); err != nil {
			return "", err
		}
	}
	if t.Next == nil {
		return a.String(), nil
	}
	out := ctx
	if t.Override != nil {
		out = t.Override(ctx, body)
	}
	rest, err := Invoke(out, t.Next, body)
	if err != nil {
		return "", err
	}
	return a.String() + " > " + rest, nil
}

// Invoke calls the Call method on cc.
func Invoke(ctx context.Context, cc grpc.ClientConnInterface, body string, opts ...grpc.CallOption) (string, error) {
	resp := new(wrapperspb.StringValue)
	if err := cc.Invoke(ctx, CallMethod, wrapperspb.String(body), resp, opts...); err != nil {
		return "", err
	}
	return resp.GetValue(), nil
}

// InvokeStream opens the Stream method on cc, sends body, and returns the
// single reply.
func InvokeStream(ctx context.Context, cc grpc.ClientConnInterface, body string) (string, error) {
	cs, err := cc.NewStream(ctx, &serviceDesc.Streams[0], StreamMethod)
	if err != nil {
		return "", err
	}
	if err := cs.SendMsg(wrapperspb.String(body)); err != nil {
		return "", err
	}
	if err := cs.CloseSend(); err != nil {
		return "", err
	}
	resp := new(wrapperspb.StringValue)
	if err := cs.RecvMsg(resp); err != nil {
		return "", err
	}
	return resp.GetValue(), nil
}

// Register registers t on s.
func Register(s grpc.ServiceRegistrar, t *Tier) { s.RegisterService(&serviceDesc, t) }

type relayServer interface {
	Call(ctx context.Context, body string) (string, error)
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*relayServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Call",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				s, err := srv.(relayServer).Call(ctx, req.(*wrapperspb.StringValue).GetValue())
				if err != nil {
					return nil, err
				}
				return wrapperspb.String(s), nil
			}
			if interceptor == nil {
				return h(ctx, in)
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: CallMethod}, h)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Stream",
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			in := new(wrapperspb.StringValue)
			if err := stream.RecvMsg(in); err != nil {
				return err
			}
			s, err := srv.(relayServer).Call(stream.Context(), in.GetValue())
			if err != nil {
				return err
			}
			return stream.SendMsg(wrapperspb.String(s))
		},
	}},
}

// Func serves the Call method (and the Stream method, with one message
// each way) with a function.
type Func func(ctx context.Context, body string) (string, error)

// Call implements the service.
func (f Func) Call(ctx context.Context, body string) (string, error) { return f(ctx, body) }

// RegisterFunc registers f as the service on s.
func RegisterFunc(s grpc.ServiceRegistrar, f Func) { s.RegisterService(&serviceDesc, f) }
