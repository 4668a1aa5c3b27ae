package triagegrpc_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/connload"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

// A batch proxy in front of a backend: batch clients call the proxy, which
// forwards any method (here the backend's Call, which the proxy knows
// nothing of) with the caller's criticality, behind its own admission
// control, and takes its own connections in through a connload.Listener
// so that a job starting thousands of clients at once cannot swamp it.
func ExampleNewProxy() {
	pol, _ := trust.New(trust.Config{Networks: []string{"127.0.0.1/32"}})
	bs, _ := triagegrpc.NewServer(triagegrpc.WithTrust(pol))
	backend := grpc.NewServer(bs.ServerOptions()...)
	relay.Register(backend, &relay.Tier{Name: "backend"})
	blis, _ := net.Listen("tcp", "127.0.0.1:0")
	go backend.Serve(blis)
	defer backend.Stop()

	// The backend is ours: its host receives triage's keys.
	caller, _ := egress.New(egress.WithoutPolicy(), egress.WithInternal("127.0.0.1"))
	client, _ := triagegrpc.NewClient(caller)
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, client.DialOptions()...)
	toBackend, _ := grpc.NewClient(blis.Addr().String(), dial...)
	defer toBackend.Close()
	px, _ := triagegrpc.NewProxy(toBackend)
	ctl, _ := admission.New()
	raw, _ := net.Listen("tcp", "127.0.0.1:0")
	lis, _ := connload.NewListener(raw) // at most 200 new connections a second
	ps, _ := triagegrpc.NewServer(triagegrpc.WithTrust(pol), triagegrpc.WithAdmission(ctl), triagegrpc.WithConnLoad(lis))
	proxy := grpc.NewServer(append(ps.ServerOptions(), px.ServerOptions()...)...)
	go proxy.Serve(lis)
	defer proxy.Stop()

	batch, _ := grpc.NewClient(lis.Addr().String(), dial...)
	defer batch.Close()
	ctx := criticality.NewContext(context.Background(), criticality.Sheddable)
	trace, err := relay.Invoke(ctx, batch, "nightly report")
	fmt.Println(trace, err)
	// Output: backend:SHEDDABLE/0 <nil>
}
