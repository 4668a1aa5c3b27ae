package app

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/triagehq/triage/triagegrpc/batchproxy"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/cmd/triage/internal/tlsfiles"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagegrpc/lb"
	"github.com/triagehq/triage/trust"
)

// proxyFlags are triage proxy's flags, parsed and checked.
type proxyFlags struct {
	listen, policy, metrics string
	addrs                   []string
	subsetSize, clientID    int
	trust                   *trust.Policy
	noAdmission             bool
	maxWait, drain          time.Duration
	queueFactor             int
	tolerance               float64
	lbConfig                string
	tls, backendTLS         tlsfiles.Files
	backendServerName       string
	unauthenticated         bool
	insecureBackends        bool
	trustIDs                []string
	log                     logFlags
}

// parseProxyFlags parses args, writing usage and errors to stderr; the
// int is the exit status when it fails (0 for -help).
func parseProxyFlags(args []string, stderr io.Writer, o *options) (*proxyFlags, int, bool) {
	fs := flag.NewFlagSet("triage proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &proxyFlags{}
	fs.StringVar(&f.listen, "listen", "127.0.0.1:7080", "gRPC listen address for batch clients")
	backends := fs.String("backends", "", "comma-separated backend addresses (host:port), required")
	fs.IntVar(&f.subsetSize, "subset", 0, "backends the proxy connects to (deterministic subsetting); 0: all of them")
	fs.IntVar(&f.clientID, "client-id", 0, "this proxy's client id for subsetting (proxies of one job use 0, 1, 2, ...)")
	fs.StringVar(&f.policy, "policy", "weighted_round_robin", "load balancing policy: round_robin, least_loaded or weighted_round_robin")
	trusted := fs.String("trust", "", "comma-separated networks (CIDR) whose criticality, attempt and customer claims are believed; default: nobody's")
	trustedIDs := fs.String("trust-identity", "", "comma-separated identities (URI or DNS SANs of client certificates that -tls-client-ca verified) whose claims are believed; default: nobody's")
	f.tls.RegisterServer(fs, "", "batch clients")
	f.backendTLS.RegisterClient(fs, "backend-", "the backends")
	fs.StringVar(&f.backendServerName, "backend-tls-server-name", "", "name the backends' certificates must carry (default: each backend's host)")
	fs.BoolVar(&f.insecureBackends, "insecure-backends", false, "dial backends beyond loopback without TLS (the calls forward their callers' metadata, authorization included, in the clear)")
	fs.BoolVar(&f.unauthenticated, "unauthenticated", false, "serve callers without verified client certificates beyond loopback (without -tls-client-ca, the proxy listens only on loopback unless told this)")
	fs.BoolVar(&f.noAdmission, "no-admission", false, "forward everything, without the proxy's own admission control (not recommended: the proxy is the fuse)")
	fs.DurationVar(&f.maxWait, "max-wait", batchproxy.DefaultMaxWait, "how long a call may wait at the proxy for an execution slot before it is refused (the proxy's admission control)")
	fs.IntVar(&f.queueFactor, "queue-factor", batchproxy.DefaultQueueFactor, "the proxy's waiting queue, as a multiple of its execution limit (0-64)")
	fs.Float64Var(&f.tolerance, "tolerance", batchproxy.DefaultTolerance, "how far the backends' latency may rise above its recent best before the proxy forwards fewer calls at once (> 1)")
	fs.DurationVar(&f.drain, "drain", 2*time.Second, "on SIGTERM, how long the proxy serves in lame duck (health NOT_SERVING) before it stops; calls still running 10 s later are cut")
	fs.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics on this address (e.g. 127.0.0.1:9091); default none")
	f.log.register(fs)
	if code, ok := o.parse(fs, args, stderr, &f.tls); !ok {
		return nil, code, false
	}
	f.addrs = splitList(*backends)
	f.trustIDs = splitList(*trustedIDs)
	if msg := f.check(fs); msg != "" {
		fmt.Fprintln(stderr, "triage proxy: "+msg)
		return nil, 2, false
	}
	pol, err := trust.New(trust.Config{Networks: splitList(*trusted), Identities: f.trustIDs})
	if err != nil {
		fmt.Fprintf(stderr, "triage proxy: -trust: %v\n", err)
		return nil, 2, false
	}
	f.trust = pol
	f.lbConfig = fmt.Sprintf(`{"policy":%q}`, f.policy)
	if f.subsetSize > 0 {
		f.lbConfig = fmt.Sprintf(`{"policy":%q,"subsetSize":%d,"clientId":%d}`, f.policy, f.subsetSize, f.clientID)
	}
	if _, err := lb.ParseConfig([]byte(f.lbConfig)); err != nil {
		fmt.Fprintf(stderr, "triage proxy: %v\n", err)
		return nil, 2, false
	}
	return f, 0, true
}

// check returns what is wrong with the flags, or "".
func (f *proxyFlags) check(fs *flag.FlagSet) string {
	switch {
	case fs.NArg() > 0:
		return fmt.Sprintf("unexpected argument %q", fs.Arg(0))
	case len(f.addrs) == 0:
		return "-backends is required"
	case len(f.addrs) > 10000:
		return "at most 10000 backends"
	case f.maxWait <= 0 || f.queueFactor < 0 || f.queueFactor > 64 || !(f.tolerance > 1) || f.tolerance > 100:
		return "-max-wait must be positive, -queue-factor between 0 and 64, -tolerance in (1, 100]"
	case f.drain < 0 || f.drain > time.Hour:
		return "-drain must be between 0 and 1h"
	case f.subsetSize < 0 || f.subsetSize > len(f.addrs) || f.clientID < 0:
		return fmt.Sprintf("-subset must be between 0 and the %d backends, -client-id >= 0", len(f.addrs))
	case f.backendServerName != "" && !f.backendTLS.Set():
		return "-backend-tls-server-name needs the backend TLS flags"
	}
	if msg := checkServing(f.listen, f.tls, f.unauthenticated, strings.Join(f.trustIDs, ",")); msg != "" {
		return msg
	}
	for _, a := range f.addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Sprintf("backend %q: %v", a, err)
		}
		if !f.backendTLS.Set() && !f.insecureBackends && beyondLoopback(a) {
			return fmt.Sprintf("backend %s is beyond loopback: give -backend-tls-ca (and a client certificate) so that the calls and their metadata are not in the clear, or -insecure-backends", a)
		}
	}
	return ""
}

// splitList splits a comma-separated flag, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// runProxy serves the batch proxy (SRE book ch. 21, "Load from
// Connections": batch client -> batch proxy -> backend) until ctx is done,
// then drains in lame duck and stops: any gRPC method is forwarded to the
// backends over one connection each, with triage's balancer, criticality
// and attempt counter, behind the proxy's own admission control.
func runProxy(ctx context.Context, args []string, stdout, stderr io.Writer, o *options) int {
	f, code, ok := parseProxyFlags(args, stderr, o)
	if !ok {
		return code
	}
	sv, code := o.startServing(ctx, "proxy", &f.log, stderr)
	if sv == nil {
		return code
	}
	defer sv.stop()
	log, reg, m := sv.log, sv.reg, sv.obs
	cc, gs, lc, err := f.build(m, reg)
	if err != nil {
		log.Error("proxy cannot start", "err", err)
		return 1
	}
	defer cc.Close()
	svc := grpcService{name: "proxy", listen: f.listen, metrics: f.metrics, reg: reg, gs: gs, lc: lc, drain: f.drain, log: log}
	return svc.run(ctx, stdout, func(a net.Addr) string {
		return fmt.Sprintf("batch proxy listening on %s: %d backends, %s", a, len(f.addrs), f.lbConfig)
	})
}

// build dials the backends through triage's balancer and builds the
// proxy's server, with its admission control and its lifecycle.
func (f *proxyFlags) build(m *observers, reg *prometheus.Registry) (*grpc.ClientConn, *grpc.Server, *lifecycle.Lifecycle, error) {
	r := manual.NewBuilderWithScheme("triage-proxy")
	creds := insecure.NewCredentials()
	if f.backendTLS.Set() {
		cfg, err := f.backendTLS.Client()
		if err != nil {
			return nil, nil, nil, err
		}
		creds = credentials.NewTLS(cfg)
	}
	var eps []resolver.Endpoint
	for _, a := range f.addrs {
		name := f.backendServerName
		if name == "" {
			name, _, _ = net.SplitHostPort(a)
		}
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a, ServerName: name}}})
	}
	r.InitialState(lb.WithTracker(resolver.State{Endpoints: eps}, m.prom.Balancers()))
	// The proxy does not retry: it is a fuse, not a retrying layer. Its
	// backends are the operator's own: every host is internal.
	caller, err := egress.New(egress.WithoutPolicy(), egress.WithInternal("*"))
	if err != nil {
		return nil, nil, nil, err
	}
	client, err := triagegrpc.NewClient(caller)
	if err != nil {
		return nil, nil, nil, err
	}
	cc, err := grpc.NewClient(r.Scheme()+":///backends", append(client.DialOptions(), grpc.WithResolvers(r),
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"triage":`+f.lbConfig+`}]}`))...)
	if err != nil {
		return nil, nil, nil, err
	}
	gs, lc, err := f.server(cc, m, reg)
	if err != nil {
		cc.Close()
		return nil, nil, nil, err
	}
	return cc, gs, lc, nil
}

// server builds the proxy's gRPC server in front of cc.
func (f *proxyFlags) server(cc *grpc.ClientConn, m *observers, reg *prometheus.Registry) (*grpc.Server, *lifecycle.Lifecycle, error) {
	px, err := batchproxy.New(cc)
	if err != nil {
		return nil, nil, err
	}
	hs := health.NewServer()
	lc, err := triagegrpc.NewLifecycle(hs, lifecycle.WithDrain(f.drain))
	if err != nil {
		return nil, nil, err
	}
	srvOpts := []triagegrpc.ServerOption{triagegrpc.WithIntake(intake.WithTrust(f.trust)), triagegrpc.WithLifecycle(lc)}
	if t := m.tracer(); t != nil {
		srvOpts = append(srvOpts, triagegrpc.WithIntake(intake.WithTracer(t)))
	}
	if !f.noAdmission {
		ctl, err := admission.New(admission.WithObserver(m.Admission()...), admission.WithMaxWait(f.maxWait),
			admission.WithQueueFactor(f.queueFactor), admission.WithTolerance(f.tolerance))
		if err != nil {
			return nil, nil, err
		}
		srvOpts = append(srvOpts, triagegrpc.WithIntake(intake.WithAdmission(ctl)))
		if err := m.admissionState(ctl, reg, nil); err != nil {
			return nil, nil, err
		}
	}
	ts, err := triagegrpc.NewServer(srvOpts...)
	if err != nil {
		return nil, nil, err
	}
	opts := append(append(ts.ServerOptions(), px.ServerOptions()...), m.grpc()...)
	if f.tls.Set() {
		cfg, err := f.tls.Server()
		if err != nil {
			return nil, nil, err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg)))
	}
	gs := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(gs, hs)
	return gs, lc, nil
}
