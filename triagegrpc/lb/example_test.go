package lb_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/loadreport"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagegrpc/lb"
)

// Backends report their load in every response (ORCA's trailer) and
// announce lame duck through health checking; a client selects the
// "triage" balancer in its service config: weighted round robin over a
// deterministic subset, with client-side health checking so that lame duck
// reaches idle clients too.
func ExampleRegister() {
	lb.Register() // once, in main

	var eps []resolver.Endpoint
	var servers []*grpc.Server
	var lifecycles []*lifecycle.Lifecycle
	for range 3 {
		meter, _ := loadreport.New(loadreport.WithUtilization(func() float64 { return 0.5 }))
		hs := health.NewServer()
		lc, _ := triagegrpc.NewLifecycle(hs, lifecycle.WithDrain(100*time.Millisecond))
		srv, _ := triagegrpc.NewServer(triagegrpc.WithLoadReports(meter), triagegrpc.WithLifecycle(lc))
		s := grpc.NewServer(srv.ServerOptions()...)
		healthpb.RegisterHealthServer(s, hs)
		lis, _ := net.Listen("tcp", "127.0.0.1:0")
		go s.Serve(lis)
		servers, lifecycles = append(servers, s), append(lifecycles, lc)
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: lis.Addr().String()}}})
	}

	r := manual.NewBuilderWithScheme("example") // stands for DNS or xDS
	r.InitialState(resolver.State{Endpoints: eps})
	cc, _ := grpc.NewClient(r.Scheme()+":///backends", grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{
		  "loadBalancingConfig": [{"triage": {"policy": "weighted_round_robin", "subsetSize": 2, "clientId": 0}}],
		  "healthCheckConfig": {"serviceName": ""}}`))
	defer cc.Close()
	for range 10 {
		if _, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			fmt.Println(err)
		}
	}
	// SIGTERM handler of each backend: lame duck, drain, graceful stop.
	for i, s := range servers {
		lifecycles[i].Shutdown(context.Background(), triagegrpc.GracefulStop(s))
	}
	fmt.Println("all backends stopped cleanly")
	// Output: all backends stopped cleanly
}
