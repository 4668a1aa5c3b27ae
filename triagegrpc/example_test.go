package triagegrpc_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

// busy stands for an overloaded service: it refuses SHEDDABLE work with
// "task overloaded" and serves the rest.
type busy struct {
	testgrpc.UnimplementedTestServiceServer
}

func (busy) EmptyCall(ctx context.Context, _ *testgrpc.Empty) (*testgrpc.Empty, error) {
	if criticality.Of(ctx) == criticality.Sheddable {
		return nil, outcome.New(outcome.TaskOverloaded, "busy")
	}
	return &testgrpc.Empty{}, nil
}

// A backend trusts its callers on the loopback network; a client
// propagates the criticality in its context, retries a rejected call (up
// to three attempts, with backoff, within its retry budget) and then gives
// up with "overloaded; don't retry", so that the layer above does not
// retry again.
func Example() {
	pol := trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})
	srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(pol)))
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer(srv.ServerOptions()...)
	testgrpc.RegisterTestServiceServer(s, busy{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go s.Serve(lis)
	defer s.Stop()

	// The backend is ours: its host receives triage's keys. The Caller
	// has the book's retry policy.
	caller, err := egress.New(egress.WithInternal("127.0.0.1"))
	if err != nil {
		log.Fatal(err)
	}
	client, err := triagegrpc.NewClient(caller)
	if err != nil {
		log.Fatal(err)
	}
	cc, err := grpc.NewClient(lis.Addr().String(),
		append(client.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	tc := testgrpc.NewTestServiceClient(cc)

	ctx := criticality.NewContext(context.Background(), criticality.CriticalPlus)
	_, err = tc.EmptyCall(ctx, &testgrpc.Empty{})
	fmt.Println(err)
	_, err = tc.EmptyCall(criticality.NewContext(ctx, criticality.Sheddable), &testgrpc.Empty{})
	fmt.Println(errors.Is(err, outcome.ErrDontRetry), status.Code(err))
	// Output:
	// <nil>
	// true ResourceExhausted
}
