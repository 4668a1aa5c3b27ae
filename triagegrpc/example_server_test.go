package triagegrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

// search stands for your service: grpc.testing's TestService, whose
// UnaryCall answers with the criticality it ran at.
type search struct {
	testgrpc.UnimplementedTestServiceServer
}

func (search) UnaryCall(ctx context.Context, _ *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{Payload: &testgrpc.Payload{Body: []byte(criticality.Of(ctx).String())}}, nil
}

// A gRPC server protected by admission control, and a client calling it:
// the server believes the criticality of callers on its trusted network
// and, when full, refuses SHEDDABLE work first; the client propagates the
// criticality of its context and retries an overloaded answer within its
// budget.
func Example_server() {
	ctl, err := admission.New() // no limit to tune: it finds the task's own
	if err != nil {
		log.Fatal(err)
	}
	pol := trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})
	tg, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithAdmission(ctl), intake.WithTrust(pol)))
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer(tg.ServerOptions()...)
	testgrpc.RegisterTestServiceServer(s, search{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go s.Serve(lis)
	defer s.Stop()

	// The client side: one Caller per backend service; its hosts get
	// triage's keys.
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
	ctx := criticality.NewContext(context.Background(), criticality.SheddablePlus)
	resp, err := testgrpc.NewTestServiceClient(cc).UnaryCall(ctx, &testgrpc.SimpleRequest{})
	fmt.Println(string(resp.GetPayload().GetBody()), err)
	// Output: SHEDDABLE_PLUS <nil>
}
