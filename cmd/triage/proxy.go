package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagegrpc/lb"
	"github.com/triagehq/triage/triageprom"
	"github.com/triagehq/triage/trust"
)

// runProxy serves the batch proxy (SRE book ch. 21, "Load from
// Connections": batch client -> batch proxy -> backend) until ctx is done:
// any gRPC method is forwarded to the backends over one connection each,
// with triage's balancer, criticality and attempt counter, behind the
// proxy's own admission control.
func runProxy(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("triage proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:7080", "gRPC listen address for batch clients")
	backends := fs.String("backends", "", "comma-separated backend addresses (host:port), required")
	subsetSize := fs.Int("subset", 0, "backends the proxy connects to (deterministic subsetting); 0: all of them")
	clientID := fs.Int("client-id", 0, "this proxy's client id for subsetting (proxies of one job use 0, 1, 2, ...)")
	policy := fs.String("policy", "weighted_round_robin", "load balancing policy: round_robin, least_loaded or weighted_round_robin")
	trusted := fs.String("trust", "", "comma-separated networks (CIDR) whose criticality, attempt and customer claims are believed; default: nobody's")
	noAdmission := fs.Bool("no-admission", false, "forward everything, without the proxy's own admission control (not recommended: the proxy is the fuse)")
	maxWait := fs.Duration("max-wait", triagegrpc.DefaultProxyMaxWait, "how long a call may wait at the proxy for an execution slot before it is refused (the proxy's admission control)")
	queueFactor := fs.Int("queue-factor", triagegrpc.DefaultProxyQueueFactor, "the proxy's waiting queue, as a multiple of its execution limit (0-64)")
	tolerance := fs.Float64("tolerance", triagegrpc.DefaultProxyTolerance, "how far the backends' latency may rise above its recent best before the proxy forwards fewer calls at once (> 1)")
	metrics := fs.String("metrics", "", "serve Prometheus metrics on this address (e.g. 127.0.0.1:9091); default none")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var addrs []string
	for _, a := range strings.Split(*backends, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "triage proxy: unexpected argument %q\n", fs.Arg(0))
		return 2
	case len(addrs) == 0:
		fmt.Fprintln(stderr, "triage proxy: -backends is required")
		return 2
	case len(addrs) > 10000:
		fmt.Fprintln(stderr, "triage proxy: at most 10000 backends")
		return 2
	case *maxWait <= 0 || *queueFactor < 0 || *queueFactor > 64 || !(*tolerance > 1) || *tolerance > 100:
		fmt.Fprintln(stderr, "triage proxy: -max-wait must be positive, -queue-factor between 0 and 64, -tolerance in (1, 100]")
		return 2
	case *subsetSize < 0 || *subsetSize > len(addrs) || *clientID < 0:
		fmt.Fprintf(stderr, "triage proxy: -subset must be between 0 and the %d backends, -client-id >= 0\n", len(addrs))
		return 2
	}
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			fmt.Fprintf(stderr, "triage proxy: backend %q: %v\n", a, err)
			return 2
		}
	}
	var networks []string
	for _, n := range strings.Split(*trusted, ",") {
		if n = strings.TrimSpace(n); n != "" {
			networks = append(networks, n)
		}
	}
	pol, err := trust.New(trust.Config{Networks: networks})
	if err != nil {
		fmt.Fprintf(stderr, "triage proxy: -trust: %v\n", err)
		return 2
	}
	lbConfig := fmt.Sprintf(`{"policy":%q}`, *policy)
	if *subsetSize > 0 {
		lbConfig = fmt.Sprintf(`{"policy":%q,"subsetSize":%d,"clientId":%d}`, *policy, *subsetSize, *clientID)
	}
	if _, err := lb.ParseConfig([]byte(lbConfig)); err != nil {
		fmt.Fprintf(stderr, "triage proxy: %v\n", err)
		return 2
	}

	m := triageprom.New()
	lb.Register(lb.WithMetrics(m.Balancers()))
	r := manual.NewBuilderWithScheme("triage-proxy")
	var eps []resolver.Endpoint
	for _, a := range addrs {
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
	}
	r.InitialState(resolver.State{Endpoints: eps})
	client := triagegrpc.NewClient(triagegrpc.WithoutPolicy()) // the proxy does not retry: it is a fuse, not a retrying layer
	cc, err := grpc.NewClient(r.Scheme()+":///backends", append(client.DialOptions(), grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"triage":`+lbConfig+`}]}`))...)
	if err != nil {
		fmt.Fprintf(stderr, "triage proxy: %v\n", err)
		return 1
	}
	defer cc.Close()
	px, err := triagegrpc.NewProxy(cc)
	if err != nil {
		fmt.Fprintf(stderr, "triage proxy: %v\n", err)
		return 1
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	srvOpts := []triagegrpc.ServerOption{triagegrpc.WithTrust(pol)}
	if !*noAdmission {
		ctl, err := admission.New(admission.WithObserver(m.Admission()), admission.WithMaxWait(*maxWait),
			admission.WithQueueFactor(*queueFactor), admission.WithTolerance(*tolerance))
		if err != nil {
			fmt.Fprintf(stderr, "triage proxy: %v\n", err)
			return 1
		}
		srvOpts = append(srvOpts, triagegrpc.WithAdmission(ctl))
		reg.MustRegister(triageprom.AdmissionState(ctl))
	}
	ts, err := triagegrpc.NewServer(srvOpts...)
	if err != nil {
		fmt.Fprintf(stderr, "triage proxy: %v\n", err)
		return 1
	}
	gs := grpc.NewServer(append(ts.ServerOptions(), px.ServerOptions()...)...)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "triage proxy: %v\n", err)
		return 1
	}
	if *metrics != "" {
		stopMetrics, err := serveMetrics(*metrics, reg)
		if err != nil {
			lis.Close()
			fmt.Fprintf(stderr, "triage proxy: %v\n", err)
			return 1
		}
		defer stopMetrics()
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		gs.GracefulStop()
	}()
	fmt.Fprintf(stdout, "batch proxy listening on %s: %d backends, %s\n", lis.Addr(), len(addrs), lbConfig)
	if err := gs.Serve(lis); err != nil {
		fmt.Fprintf(stderr, "triage proxy: %v\n", err)
		return 1
	}
	<-stopped
	return 0
}
