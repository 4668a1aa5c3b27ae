package triagegrpc_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/triagegrpc"
)

// recoverUnary and recoverStream are the recovery interceptors users chain
// before triage's: a handler's panic becomes INTERNAL.
func recoverUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = status.Errorf(codes.Internal, "panic: %v", r)
		}
	}()
	return h(ctx, req)
}

func recoverStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = status.Errorf(codes.Internal, "panic: %v", r)
		}
	}()
	return h(srv, ss)
}

// A handler that panics, under a recovery interceptor chained before
// triage's, gives back everything its request held: after limit panics
// (and more), nothing executes and a normal call is served.
func TestHandlerPanicGivesTheSlotBack(t *testing.T) {
	const limit = 4
	ctl, err := admission.New(admission.WithLimits(1, limit, limit), admission.WithInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ts, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithAdmission(ctl)))
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(recoverUnary), grpc.ChainStreamInterceptor(recoverStream)}, ts.ServerOptions()...)...)
	relay.RegisterFunc(s, func(_ context.Context, body string) (string, error) {
		if body == "panic" {
			panic("handler bug")
		}
		return body, nil
	})
	cc := loopback.DialGRPC(t, loopback.ServeGRPC(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 3*limit; i++ {
		_, err := relay.Invoke(ctx, cc, "panic")
		if status.Code(err) != codes.Internal {
			t.Fatalf("unary panic %d: %v, want INTERNAL from the recovery interceptor", i, err)
		}
		_, err = relay.InvokeStream(ctx, cc, "panic")
		if status.Code(err) != codes.Internal {
			t.Fatalf("stream panic %d: %v, want INTERNAL from the recovery interceptor", i, err)
		}
	}
	loopback.WaitFor(t, "no request executing", func() bool { return ctl.Stats().Executing == 0 })
	if st := ctl.Stats(); st.Executing != 0 || st.Pending != 0 {
		t.Fatalf("after %d panics: %+v, want nothing executing or pending", 6*limit, st)
	}
	for i := 0; i < 2*limit; i++ {
		if got, err := relay.Invoke(ctx, cc, fmt.Sprint(i)); err != nil || got != fmt.Sprint(i) {
			t.Fatalf("call %d after the panics: %q, %v", i, got, err)
		}
	}
}
