package app

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/cmd/triage/internal/tlsfiles"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/shadow"
	"github.com/triagehq/triage/triageextproc"
	"github.com/triagehq/triage/triagegrpc"
)

// DefaultExtprocMaxWait is triage extproc's -max-wait: below Envoy's
// default message_timeout (200 ms), so that a request waiting for a slot
// is answered before Envoy gives up on the processor (docs/envoy.md).
const DefaultExtprocMaxWait = 150 * time.Millisecond

// extprocFlags are triage extproc's flags, parsed and checked.
type extprocFlags struct {
	listen, metrics string
	edge            edgeFlags
	admission       admissionFlags
	unauthed        bool
	drain           time.Duration
	tls             tlsfiles.Files
	log             logFlags
}

// parseExtprocFlags parses args, writing usage and errors to stderr; the
// int is the exit status when it fails (0 for -help).
func parseExtprocFlags(args []string, stderr io.Writer, o *options) (*extprocFlags, int, bool) {
	fs := flag.NewFlagSet("triage extproc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &extprocFlags{}
	fs.StringVar(&f.listen, "listen", "127.0.0.1:7092", "gRPC address Envoy's ext_proc filter calls (envoy.service.ext_proc.v3.ExternalProcessor)")
	f.edge.register(fs)
	f.tls.RegisterServer(fs, "", "Envoy")
	fs.BoolVar(&f.unauthed, "unauthenticated", false, "serve Envoy without a verified client certificate beyond loopback")
	f.admission.register(fs, DefaultExtprocMaxWait)
	fs.DurationVar(&f.drain, "drain", 2*time.Second, "on SIGTERM, how long the processor answers health NOT_SERVING before it stops; streams still open 10 s later are cut")
	fs.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics on this address (e.g. 127.0.0.1:9093); default none")
	f.log.register(fs)
	if code, ok := o.parse(fs, args, stderr, &f.tls); !ok {
		return nil, code, false
	}
	msg := f.admission.check()
	if msg == "" {
		msg = checkServing(f.listen, f.tls, f.unauthed, f.edge.identities)
	}
	switch {
	case msg != "":
	case fs.NArg() > 0:
		msg = fmt.Sprintf("unexpected argument %q", fs.Arg(0))
	case f.drain < 0 || f.drain > time.Hour:
		msg = "-drain must be between 0 and 1h"
	}
	if msg != "" {
		fmt.Fprintln(stderr, "triage extproc: "+msg)
		return nil, 2, false
	}
	if err := f.edge.build(); err != nil {
		fmt.Fprintf(stderr, "triage extproc: %v\n", err)
		return nil, 2, false
	}
	return f, 0, true
}

// runExtproc serves Envoy's external processor until ctx is done, then
// drains and stops.
func runExtproc(ctx context.Context, args []string, stdout, stderr io.Writer, o *options) int {
	f, code, ok := parseExtprocFlags(args, stderr, o)
	if !ok {
		return code
	}
	sv, code := o.startServing(ctx, "extproc", &f.log, stderr)
	if sv == nil {
		return code
	}
	defer sv.stop()
	log, reg, m := sv.log, sv.reg, sv.obs
	gs, lc, err := f.server(m, reg)
	if err != nil {
		log.Error("extproc cannot start", "err", err)
		return 1
	}
	if err := f.edge.watch(ctx, log); err != nil {
		log.Error("extproc cannot watch its configuration", "err", err)
		return 1
	}
	svc := grpcService{name: "extproc", listen: f.listen, metrics: f.metrics, reg: reg, gs: gs, lc: lc, drain: f.drain, log: log}
	return svc.run(ctx, stdout, func(a net.Addr) string {
		return fmt.Sprintf("ext_proc server listening on %s (envoy.service.ext_proc.v3.ExternalProcessor)", a)
	})
}

// server builds the gRPC server: the processor, health and lifecycle.
func (f *extprocFlags) server(m *observers, reg *prometheus.Registry) (*grpc.Server, *lifecycle.Lifecycle, error) {
	opts := append(m.intake(), intake.WithTrust(f.edge.trust), intake.WithClassifier(f.edge.classifier), intake.WithPeerShare(f.admission.peerShare))
	if f.admission.shadow {
		opts = append(opts, intake.WithShadow(shadow.All(), m.Shadow()))
	}
	// One controller for each upstream cluster Envoy names, its state
	// labelled with the cluster ("" for requests that name none).
	admit := func(cluster string) (*admission.Controller, error) {
		labels := prometheus.Labels{"cluster": cluster}
		return f.admission.newController(m, prometheus.WrapRegistererWith(labels, reg), labels)
	}
	newServer := func() (*triageextproc.Server, error) { return triageextproc.NewPerCluster(admit, opts...) }
	if f.admission.off {
		newServer = func() (*triageextproc.Server, error) { return triageextproc.New(opts...) }
	}
	ep, err := newServer()
	if err != nil {
		return nil, nil, err
	}
	// Every decision within -max-wait, which the documented configuration
	// keeps 50 ms below Envoy's message_timeout: a CRITICAL request with a
	// caller's deadline would otherwise wait on and be let through
	// unprocessed.
	ep.DecisionTimeout = f.admission.maxWait
	ep.HealthChecks = f.edge.healthChecks
	if name := f.edge.groupHeader; name != "" {
		ep.Group = func(header func(string) string) string { return header(name) }
	}
	sopts := m.grpc()
	if f.tls.Set() {
		cfg, err := f.tls.Server()
		if err != nil {
			return nil, nil, err
		}
		sopts = append(sopts, grpc.Creds(credentials.NewTLS(cfg)))
	}
	gs := grpc.NewServer(sopts...)
	ep.Register(gs)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	lc, err := triagegrpc.NewLifecycle(hs, lifecycle.WithDrain(f.drain))
	if err != nil {
		return nil, nil, err
	}
	return gs, lc, nil
}
