package triagegrpc

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/loadtest"
	"github.com/triagehq/triage/triagegrpc/internal/forward"
)

// NewLoadTarget returns a loadtest.Target that calls the unary method
// ("/package.Service/Method") on cc with req, the request message's
// protobuf wire bytes (nil or empty: a message with every field at its
// default, which every method accepts), and discards the response. Dial
// cc with a Client's DialOptions (WithoutPolicy, so that the load test
// sees the service's answers, not the client's retries) to send each
// call's criticality the way triage's clients do.
//
// Outcomes: OK for a success; Overloaded for UNAVAILABLE and
// RESOURCE_EXHAUSTED (a task that is down also answers UNAVAILABLE);
// DeadlineExceeded when the call's deadline passed; Failed otherwise.
func NewLoadTarget(cc grpc.ClientConnInterface, method string, req []byte) (loadtest.Target, error) {
	if cc == nil {
		return nil, errors.New("triagegrpc: load target without a connection")
	}
	if len(method) < 4 || method[0] != '/' {
		return nil, errors.New(`triagegrpc: load target method must be "/package.Service/Method"`)
	}
	t := &loadTarget{cc: cc, method: method, req: req,
		codec: grpc.ForceCodecV2(forward.NewCodec())}
	return t, nil
}

type loadTarget struct {
	cc     grpc.ClientConnInterface
	method string
	req    []byte
	codec  grpc.CallOption
}

func (t *loadTarget) Call(ctx context.Context) loadtest.Outcome {
	var resp forward.Frame
	err := t.cc.Invoke(ctx, t.method, &forward.Frame{B: t.req}, &resp, t.codec)
	return loadOutcome(ctx, err)
}

func loadOutcome(ctx context.Context, err error) loadtest.Outcome {
	if err == nil {
		return loadtest.OK
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return loadtest.DeadlineExceeded
	}
	switch status.Code(err) {
	case codes.DeadlineExceeded:
		return loadtest.DeadlineExceeded
	case codes.Unavailable, codes.ResourceExhausted:
		return loadtest.Overloaded
	}
	return loadtest.Failed
}
