package triagegrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

// A backend trusts its callers on the loopback network and rejects
// SHEDDABLE work with "task overloaded"; a client propagates the
// criticality in its context, retries the rejected call (up to three
// attempts, with backoff, within its retry budget) and then gives up with
// "overloaded; don't retry", so that the layer above does not retry again.
func Example() {
	pol, _ := trust.New(trust.Config{Networks: []string{"127.0.0.1/32"}})
	srv, _ := triagegrpc.NewServer(triagegrpc.WithTrust(pol))
	s := grpc.NewServer(srv.ServerOptions()...)
	relay.Register(s, &relay.Tier{Name: "backend", Fail: func(ctx context.Context, _ string) error {
		if criticality.Of(ctx) == criticality.Sheddable {
			return outcome.New(outcome.TaskOverloaded, "busy")
		}
		return nil
	}})
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	go s.Serve(lis)
	defer s.Stop()

	// The backend is ours: its host receives triage's keys. The Caller
	// has the book's retry policy.
	caller, _ := egress.New(egress.WithInternal("127.0.0.1"))
	client, _ := triagegrpc.NewClient(caller)
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, client.DialOptions()...)
	cc, _ := grpc.NewClient(lis.Addr().String(), opts...)
	defer cc.Close()

	ctx := criticality.NewContext(context.Background(), criticality.CriticalPlus)
	fmt.Println(relay.Invoke(ctx, cc, "hello"))

	_, err := relay.Invoke(criticality.NewContext(ctx, criticality.Sheddable), cc, "prefetch")
	fmt.Println(errors.Is(err, outcome.ErrDontRetry), status.Code(err))
	// Output:
	// backend:CRITICAL_PLUS/0 <nil>
	// true ResourceExhausted
}
