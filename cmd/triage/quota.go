package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/triagehq/triage/cmd/triage/internal/tlsfiles"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagegrpc/quotaservice"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotapb"
	"github.com/triagehq/triage/triageprom"
	"github.com/triagehq/triage/triageyaml"
)

// serveMetrics serves reg's metrics over HTTP on addr until the returned
// function is called.
func serveMetrics(addr string, reg *prometheus.Registry) (func(), error) {
	ml, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	hs := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(ml)
	return func() { hs.Close() }, nil
}

// runQuotaServer serves the quota service (quotapb.Quota) until ctx is
// done: tasks report usage and get leases; the policy file is reloaded
// when it changes, and a bad one is refused with the last good one kept.
func runQuotaServer(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("triage quota-server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "", "YAML quota policy (required; see quota.Config)")
	listen := fs.String("listen", "127.0.0.1:7070", "gRPC listen address")
	lease := fs.Duration("lease", 30*time.Second, "how long a lease is valid")
	refresh := fs.Duration("refresh", 5*time.Second, "how often tasks renew their lease (jittered ±25% by each task)")
	reload := fs.Duration("reload", time.Second, "how often the policy file is checked for changes")
	metrics := fs.String("metrics", "", "serve Prometheus metrics on this address (e.g. 127.0.0.1:9090); default none")
	var tlsFiles tlsfiles.Files
	tlsFiles.Register(fs, "", "tasks")
	binds := bindFlag{}
	fs.Var(binds, "bind", "IDENTITY=TASK: a task whose verified client certificate names IDENTITY reports as TASK (repeatable; needs -tls-ca). An identity not bound reports as itself")
	unauthenticated := fs.Bool("unauthenticated", false, "accept reports from callers without a verified client certificate, their task ids believed as sent (needed to listen beyond loopback without -tls-ca)")
	drain := fs.Duration("drain", time.Second, "on SIGTERM, how long the service answers in lame duck (health NOT_SERVING) before it stops; calls still running 5 s later are cut")
	modeName := fs.String("mode", "optimistic", "throttling mode: optimistic, or pessimistic (the tasks' shares of a limit never sum over 1; pair with tasks whose quota.Enforcer runs quota.ModePessimistic)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "triage quota-server: unexpected argument %q\n", fs.Arg(0))
		return 2
	case *config == "":
		fmt.Fprintln(stderr, "triage quota-server: -config is required")
		return 2
	case *refresh <= 0 || *lease < *refresh || *lease > 24*time.Hour || *reload <= 0:
		fmt.Fprintln(stderr, "triage quota-server: need 0 < -refresh <= -lease <= 24h and a positive -reload")
		return 2
	case *drain < 0 || *drain > time.Hour:
		fmt.Fprintln(stderr, "triage quota-server: -drain must be between 0 and 1h")
		return 2
	case len(binds) > 0 && tlsFiles.CA == "":
		fmt.Fprintln(stderr, "triage quota-server: -bind needs -tls-ca (identities come from verified client certificates)")
		return 2
	case tlsFiles.CA != "" && *unauthenticated:
		fmt.Fprintln(stderr, "triage quota-server: -unauthenticated and -tls-ca contradict each other")
		return 2
	case tlsFiles.CA == "" && !*unauthenticated && beyondLoopback(*listen):
		fmt.Fprintf(stderr, "triage quota-server: -listen %s is beyond loopback: give -tls-cert, -tls-key and -tls-ca so that tasks are authenticated, or -unauthenticated\n", *listen)
		return 2
	}
	var creds []grpc.ServerOption
	var svcOpts []quotaservice.ServiceOption
	if tlsFiles.Set() {
		cfg, err := tlsFiles.Server()
		if err != nil {
			fmt.Fprintf(stderr, "triage quota-server: %v\n", err)
			return 2
		}
		creds = append(creds, grpc.Creds(credentials.NewTLS(cfg)))
	}
	if tlsFiles.CA != "" {
		svcOpts = append(svcOpts, quotaservice.WithTaskIdentities(binds))
	}
	mode, err := quota.ParseMode(*modeName)
	if err != nil {
		fmt.Fprintf(stderr, "triage quota-server: -mode: %v\n", err)
		return 2
	}
	var alloc *quota.Allocator
	w, err := triageyaml.WatchQuota(*config, func(p *quota.Policy) {
		if alloc != nil {
			alloc.SetPolicy(p)
			fmt.Fprintf(stdout, "policy reloaded: %d customers\n", len(p.Customers()))
		}
	}, triageyaml.WithWatchInterval(*reload))
	if err != nil {
		fmt.Fprintf(stderr, "triage quota-server: %v\n", err)
		return 1
	}
	p, _ := triageyaml.LoadQuota(*config) // just validated by WatchQuota
	if alloc, err = quota.NewAllocator(p, quota.WithLease(*lease), quota.WithRefresh(*refresh), quota.WithAllocatorMode(mode)); err != nil {
		fmt.Fprintf(stderr, "triage quota-server: %v\n", err)
		return 1
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "triage quota-server: %v\n", err)
		return 1
	}
	gs := grpc.NewServer(append(creds, quotaservice.ServerOptions()...)...)
	quotapb.RegisterQuotaServer(gs, quotaservice.NewService(alloc, svcOpts...))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	lc, err := triagegrpc.NewLifecycle(hs, lifecycle.WithDrain(*drain))
	if err != nil {
		fmt.Fprintf(stderr, "triage quota-server: %v\n", err)
		return 1
	}
	if *metrics != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(triageprom.New().QuotaService(alloc))
		stopMetrics, err := serveMetrics(*metrics, reg)
		if err != nil {
			fmt.Fprintf(stderr, "triage quota-server: %v\n", err)
			return 1
		}
		defer stopMetrics()
	}
	go w.Run(ctx, func(err error) {
		fmt.Fprintf(stderr, "triage quota-server: policy refused, keeping the last good one: %v\n", err)
	})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), *drain+5*time.Second)
		defer cancel()
		lc.Shutdown(sctx, triagegrpc.GracefulStop(gs))
	}()
	auth := "tasks authenticated by client certificate"
	if tlsFiles.CA == "" {
		auth = "tasks NOT authenticated"
	}
	fmt.Fprintf(stdout, "quota service listening on %s: %d customers, lease %v, refresh %v, %s\n", lis.Addr(), len(p.Customers()), *lease, *refresh, auth)
	if err := gs.Serve(lis); err != nil {
		fmt.Fprintf(stderr, "triage quota-server: %v\n", err)
		return 1
	}
	<-stopped
	return 0
}

// bindFlag is -bind: IDENTITY=TASK pairs.
type bindFlag map[string]string

func (b bindFlag) String() string { return fmt.Sprint(map[string]string(b)) }

func (b bindFlag) Set(v string) error {
	id, task, ok := strings.Cut(v, "=")
	if !ok || strings.TrimSpace(id) == "" {
		return errors.New("want IDENTITY=TASK")
	}
	if err := quota.ValidName(task); err != nil {
		return fmt.Errorf("task %q: %v", task, err)
	}
	if _, dup := b[id]; dup {
		return fmt.Errorf("identity %q bound twice", id)
	}
	if len(b) >= quota.MaxCustomers {
		return errors.New("too many -bind flags")
	}
	b[id] = task
	return nil
}

// beyondLoopback reports whether a listen address reaches beyond loopback
// (an address that does not parse is left to net.Listen to refuse).
func beyondLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "localhost" {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err != nil || !ip.IsLoopback()
}
