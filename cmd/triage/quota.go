package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/triagehq/triage/quota"
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
	gs := grpc.NewServer(quotapb.ServerOption())
	quotapb.RegisterQuotaServer(gs, quotaservice.NewService(alloc))
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
	go func() {
		<-ctx.Done()
		gs.GracefulStop()
	}()
	fmt.Fprintf(stdout, "quota service listening on %s: %d customers, lease %v, refresh %v\n", lis.Addr(), len(p.Customers()), *lease, *refresh)
	if err := gs.Serve(lis); err != nil {
		fmt.Fprintf(stderr, "triage quota-server: %v\n", err)
		return 1
	}
	return 0
}
