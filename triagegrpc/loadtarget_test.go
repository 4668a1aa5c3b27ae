package triagegrpc_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/loadtest"
	"github.com/triagehq/triage/triagegrpc"
)

// A load target calls any method with the bytes it was given, sends the
// call's criticality, and classifies the answers.
func TestLoadTargetOverLoopback(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	s := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(stream)
		var in wrapperspb.StringValue
		if err := stream.RecvMsg(&in); err != nil {
			return err
		}
		md, _ := metadata.FromIncomingContext(stream.Context())
		mu.Lock()
		seen = append(seen, in.GetValue()+"/"+strings.Join(md.Get("triage-criticality"), ","))
		mu.Unlock()
		switch method {
		case "/t.S/OK":
			return stream.SendMsg(&emptypb.Empty{})
		case "/t.S/Shed":
			return status.Error(codes.Unavailable, "overloaded")
		case "/t.S/Quota":
			return status.Error(codes.ResourceExhausted, "out of quota")
		case "/t.S/Slow":
			<-stream.Context().Done()
			return stream.Context().Err()
		}
		return status.Error(codes.InvalidArgument, "no")
	}))
	addr := loopback.ServeGRPC(t, s)
	cc := loopback.DialGRPC(t, addr, loopback.Client(t, egress.WithoutPolicy()).DialOptions()...)
	req, err := proto.Marshal(wrapperspb.String("hello"))
	if err != nil {
		t.Fatal(err)
	}
	for method, want := range map[string]loadtest.Outcome{
		"/t.S/OK": loadtest.OK, "/t.S/Shed": loadtest.Overloaded, "/t.S/Quota": loadtest.Overloaded,
		"/t.S/Slow": loadtest.DeadlineExceeded, "/t.S/Bad": loadtest.Failed,
	} {
		target, err := triagegrpc.NewLoadTarget(cc, method, req)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(criticality.NewContext(context.Background(), criticality.SheddablePlus), 300*time.Millisecond)
		got := target.Call(ctx)
		cancel()
		if got != want {
			t.Errorf("%s: %v, want %v", method, got, want)
		}
	}
	mu.Lock()
	calls := append([]string(nil), seen...)
	mu.Unlock()
	if len(calls) != 5 {
		t.Fatalf("server saw %d calls, want 5", len(calls))
	}
	for _, s := range calls {
		if s != "hello/SHEDDABLE_PLUS" {
			t.Errorf("server saw %q, want the message's bytes and the call's criticality (hello/SHEDDABLE_PLUS)", s)
		}
	}
	// The empty message: every method accepts it.
	empty, _ := triagegrpc.NewLoadTarget(cc, "/t.S/OK", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if got := empty.Call(ctx); got != loadtest.OK {
		t.Errorf("empty request: %v", got)
	}
	if _, err := triagegrpc.NewLoadTarget(cc, "t.S/OK", nil); err == nil {
		t.Error("a method without its leading slash was accepted")
	}
	if _, err := triagegrpc.NewLoadTarget(nil, "/t.S/OK", nil); err == nil {
		t.Error("a target without a connection was accepted")
	}
}
