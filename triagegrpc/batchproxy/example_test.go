package batchproxy_test

import (
	"context"
	"fmt"
	"net"

	"github.com/triagehq/triage/triagegrpc/batchproxy"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/connload"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

// reports stands for a backend's service: grpc.testing's TestService,
// whose UnaryCall answers with the criticality it ran at.
type reports struct {
	testgrpc.UnimplementedTestServiceServer
}

func (reports) UnaryCall(ctx context.Context, _ *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{Payload: &testgrpc.Payload{Body: []byte(criticality.Of(ctx).String())}}, nil
}

// A batch proxy in front of a backend: batch clients call the proxy, which
// forwards any method (here the backend's UnaryCall, which the proxy
// knows nothing of) with the caller's criticality, behind its own admission
// control, and takes its own connections in through a connload.Listener
// so that a job starting thousands of clients at once cannot swamp it.
func Example() {
	pol, _ := trust.New(trust.Config{Networks: []string{"127.0.0.1/32"}})
	bs, _ := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(pol)))
	backend := grpc.NewServer(bs.ServerOptions()...)
	testgrpc.RegisterTestServiceServer(backend, reports{})
	blis, _ := net.Listen("tcp", "127.0.0.1:0")
	go backend.Serve(blis)
	defer backend.Stop()

	// The backend is ours: its host receives triage's keys.
	caller, _ := egress.New(egress.WithoutPolicy(), egress.WithInternal("127.0.0.1"))
	client, _ := triagegrpc.NewClient(caller)
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, client.DialOptions()...)
	toBackend, _ := grpc.NewClient(blis.Addr().String(), dial...)
	defer toBackend.Close()
	px, _ := batchproxy.New(toBackend)
	ctl, _ := admission.New()
	raw, _ := net.Listen("tcp", "127.0.0.1:0")
	lis, _ := connload.NewListener(raw) // at most 200 new connections a second
	ps, _ := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(pol), intake.WithAdmission(ctl)), triagegrpc.WithConnLoad(lis))
	proxy := grpc.NewServer(append(ps.ServerOptions(), px.ServerOptions()...)...)
	go proxy.Serve(lis)
	defer proxy.Stop()

	batch, _ := grpc.NewClient(lis.Addr().String(), dial...)
	defer batch.Close()
	ctx := criticality.NewContext(context.Background(), criticality.Sheddable)
	resp, err := testgrpc.NewTestServiceClient(batch).UnaryCall(ctx, &testgrpc.SimpleRequest{})
	fmt.Println(string(resp.GetPayload().GetBody()), err)
	// Output: SHEDDABLE <nil>
}
