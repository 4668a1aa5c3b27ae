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
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/triagehq/triage/cmd/triage/internal/tlsfiles"
	"github.com/triagehq/triage/internal/grantlog"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagegrpc/quotaservice"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotapb"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotareplica"
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
	config := fs.String("config", "", "YAML quota policy file (see quota.Config); this or -policy-key is required")
	listen := fs.String("listen", "127.0.0.1:7070", "gRPC listen address")
	lease := fs.Duration("lease", 30*time.Second, "how long a lease is valid")
	refresh := fs.Duration("refresh", 5*time.Second, "how often tasks renew their lease (jittered ±25% by each task)")
	reload := fs.Duration("reload", time.Second, "how often the policy file is checked for changes")
	metrics := fs.String("metrics", "", "serve Prometheus metrics on this address (e.g. 127.0.0.1:9090); default none")
	var tlsFiles tlsfiles.Files
	tlsFiles.Register(fs, "", "tasks")
	binds := bindFlag{}
	fs.Var(binds, "bind", "IDENTITY=TASK: a task whose verified client certificate names IDENTITY reports as TASK (repeatable; needs -tls-ca). An identity not bound reports as itself")
	boundOnly := fs.Bool("bound-only", false, "with -tls-ca, refuse a caller none of whose identities -bind names, instead of letting it report as a task named after its identity (default true when -bind is given: under a mesh's or SPIFFE's CA any workload has an identity)")
	insecureEtcd := fs.Bool("insecure-etcd", false, "talk to -etcd endpoints beyond loopback without TLS (whoever reaches etcd writes the policy and the election)")
	unauthenticated := fs.Bool("unauthenticated", false, "accept reports from callers without a verified client certificate, their task ids believed as sent (needed to listen beyond loopback without -tls-ca)")
	drain := fs.Duration("drain", time.Second, "on SIGTERM, how long the service answers in lame duck (health NOT_SERVING) before it stops; calls still running 5 s later are cut")
	etcdEndpoints := fs.String("etcd", "", "comma-separated etcd endpoints: run as one of several replicas, the leader elected through etcd (quotareplica); default one process, no etcd")
	advertise := fs.String("advertise", "", "with -etcd, the address tasks reach this replica at (told to tasks by the other replicas; required with -etcd)")
	sessionTTL := fs.Int("session-ttl", quotareplica.DefaultSessionTTL, "with -etcd, the etcd session TTL in seconds: how long a dead leader holds the election")
	electionPrefix := fs.String("election-prefix", quotareplica.DefaultElectionPrefix, "with -etcd, the etcd key prefix of the election (replicas of one service share it)")
	policyKey := fs.String("policy-key", "", "with -etcd, the etcd key holding the YAML policy, instead of -config: every replica watches it, refuses a bad push and keeps the last good policy")
	grantLog := fs.String("grant-log", "", "append every share granted to this file, one JSON line each (an audit trail; internal/grantlog), written off the refresh path; its errors go to stderr and triage_quota_grant_log_errors_total")
	grantLogMax := fs.Int64("grant-log-max-bytes", 100<<20, "with -grant-log, rotate the file (to FILE.1, FILE.2, ...) before it passes this size")
	grantLogBackups := fs.Int("grant-log-backups", 5, "with -grant-log, how many rotated files to keep (0 to 100)")
	var etcdTLS tlsfiles.Files
	etcdTLS.Register(fs, "etcd-", "etcd")
	modeName := fs.String("mode", "optimistic", "throttling mode: optimistic, or pessimistic (the tasks' shares of a limit never sum over 1; pair with tasks whose quota.Enforcer runs quota.ModePessimistic)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if !flagSet(fs, "bound-only") {
		*boundOnly = len(binds) > 0
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "triage quota-server: unexpected argument %q\n", fs.Arg(0))
		return 2
	case *config == "" && *policyKey == "":
		fmt.Fprintln(stderr, "triage quota-server: -config is required (or -policy-key with -etcd)")
		return 2
	case *config != "" && *policyKey != "":
		fmt.Fprintln(stderr, "triage quota-server: -config and -policy-key contradict each other: the policy lives in one place")
		return 2
	case *etcdEndpoints == "" && (*policyKey != "" || *advertise != "" || etcdTLS.Set()):
		fmt.Fprintln(stderr, "triage quota-server: -policy-key, -advertise and -etcd-tls-* need -etcd")
		return 2
	case *etcdEndpoints != "" && *advertise == "":
		fmt.Fprintln(stderr, "triage quota-server: -etcd needs -advertise, the address tasks reach this replica at")
		return 2
	case *etcdEndpoints != "" && (*sessionTTL < 2 || *sessionTTL > 3600):
		fmt.Fprintln(stderr, "triage quota-server: -session-ttl must be 2 to 3600 seconds")
		return 2
	case *refresh <= 0 || *lease < *refresh || *lease > 24*time.Hour || *reload <= 0:
		fmt.Fprintln(stderr, "triage quota-server: need 0 < -refresh <= -lease <= 24h and a positive -reload")
		return 2
	case *grantLog == "" && (*grantLogMax != 100<<20 || *grantLogBackups != 5):
		fmt.Fprintln(stderr, "triage quota-server: -grant-log-max-bytes and -grant-log-backups need -grant-log")
		return 2
	case *drain < 0 || *drain > time.Hour:
		fmt.Fprintln(stderr, "triage quota-server: -drain must be between 0 and 1h")
		return 2
	case *etcdEndpoints != "" && !etcdTLS.Set() && !*insecureEtcd && etcdBeyondLoopback(*etcdEndpoints):
		fmt.Fprintf(stderr, "triage quota-server: -etcd %s is beyond loopback: give -etcd-tls-ca (and a client certificate) so that the policy and the election are not in the clear, or -insecure-etcd\n", *etcdEndpoints)
		return 2
	case len(binds) > 0 && tlsFiles.CA == "":
		fmt.Fprintln(stderr, "triage quota-server: -bind needs -tls-ca (identities come from verified client certificates)")
		return 2
	case *boundOnly && tlsFiles.CA == "":
		fmt.Fprintln(stderr, "triage quota-server: -bound-only needs -tls-ca (identities come from verified client certificates)")
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
		if *boundOnly {
			svcOpts = append(svcOpts, quotaservice.WithBoundIdentitiesOnly())
		}
	}
	mode, err := quota.ParseMode(*modeName)
	if err != nil {
		fmt.Fprintf(stderr, "triage quota-server: -mode: %v\n", err)
		return 2
	}
	var cli *clientv3.Client
	if *etcdEndpoints != "" {
		if cli, err = dialEtcd(*etcdEndpoints, etcdTLS); err != nil {
			fmt.Fprintf(stderr, "triage quota-server: -etcd: %v\n", err)
			return 2
		}
		defer cli.Close()
	}
	src, err := loadPolicySource(ctx, *config, *reload, cli, *policyKey)
	if err != nil {
		fmt.Fprintf(stderr, "triage quota-server: %v\n", err)
		return 1
	}
	var extraMetrics []prometheus.Collector
	if *grantLog != "" {
		name := *advertise
		if name == "" {
			name = *listen
		}
		gl, stop, err := startGrantLog(ctx, *grantLog, *grantLogMax, *grantLogBackups, name, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "triage quota-server: -grant-log: %v\n", err)
			return 1
		}
		defer stop()
		svcOpts = append(svcOpts, quotaservice.WithGrantLog(gl.Lease))
		extraMetrics = grantLogMetrics(gl)
	}
	newAlloc := func(p *quota.Policy, extra ...quota.AllocatorOption) (*quota.Allocator, error) {
		return quota.NewAllocator(p, append(extra, quota.WithLease(*lease), quota.WithRefresh(*refresh), quota.WithAllocatorMode(mode))...)
	}
	// One process serves its Allocator; a replica serves the one of its
	// term as leader.
	var (
		server    quotapb.QuotaServer
		collector prometheus.Collector
		setPolicy func(*quota.Policy, int64)
		runMore   func(context.Context) error
	)
	if cli == nil {
		alloc, err := newAlloc(src.policy)
		if err != nil {
			fmt.Fprintf(stderr, "triage quota-server: %v\n", err)
			return 1
		}
		server = quotaservice.NewService(alloc, svcOpts...)
		collector = triageprom.New().QuotaService(alloc)
		setPolicy = func(p *quota.Policy, _ int64) { alloc.SetPolicy(p) }
	} else {
		r, err := quotareplica.New(cli, *advertise, src.policy, newAlloc, quotareplica.WithSessionTTL(*sessionTTL),
			quotareplica.WithElectionPrefix(*electionPrefix), quotareplica.WithServiceOptions(svcOpts...))
		if err != nil {
			fmt.Fprintf(stderr, "triage quota-server: %v\n", err)
			return 2
		}
		r.SetPolicy(src.policy, src.version)
		server, setPolicy, runMore = r, r.SetPolicy, r.Run
		collector = triageprom.New().QuotaReplica(r)
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "triage quota-server: %v\n", err)
		return 1
	}
	gs := grpc.NewServer(append(creds, quotaservice.ServerOptions()...)...)
	quotapb.RegisterQuotaServer(gs, server)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	lc, err := triagegrpc.NewLifecycle(hs, lifecycle.WithDrain(*drain))
	if err != nil {
		fmt.Fprintf(stderr, "triage quota-server: %v\n", err)
		return 1
	}
	if *metrics != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collector)
		reg.MustRegister(extraMetrics...)
		stopMetrics, err := serveMetrics(*metrics, reg)
		if err != nil {
			fmt.Fprintf(stderr, "triage quota-server: %v\n", err)
			return 1
		}
		defer stopMetrics()
	}
	go src.run(ctx, func(p *quota.Policy, version int64) {
		setPolicy(p, version)
		fmt.Fprintf(stdout, "policy %d in force: %d customers\n", version, len(p.Customers()))
	}, func(version int64, err error) {
		fmt.Fprintf(stderr, "triage quota-server: policy %d refused, keeping the last good one: %v\n", version, err)
	})
	ranMore := make(chan struct{})
	if runMore != nil {
		// Until ctx is done; then the replica resigns, so that another
		// takes over at once: wait for it before exiting.
		go func() { defer close(ranMore); runMore(ctx) }()
	} else {
		close(ranMore)
	}
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
	how := "one process"
	if cli != nil {
		how = fmt.Sprintf("a replica advertised as %s, leader elected through etcd %s", *advertise, *etcdEndpoints)
	}
	fmt.Fprintf(stdout, "quota service listening on %s: %d customers (policy %s), lease %v, refresh %v, %s, %s\n", lis.Addr(), len(src.policy.Customers()), src.where, *lease, *refresh, auth, how)
	if err := gs.Serve(lis); err != nil {
		fmt.Fprintf(stderr, "triage quota-server: %v\n", err)
		return 1
	}
	<-stopped
	<-ranMore
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

// startGrantLog opens the grant log at path for the replica named name
// and writes it until stop, which writes out what is queued and closes
// the file. Write errors go to stderr.
func startGrantLog(ctx context.Context, path string, maxBytes int64, backups int, name string, stderr io.Writer) (gl *grantlog.Writer, stop func(), err error) {
	f, err := grantlog.OpenFile(path, maxBytes, backups)
	if err != nil {
		return nil, nil, err
	}
	gl = grantlog.NewWriter(f, name, time.Now, func(err error) {
		fmt.Fprintf(stderr, "triage quota-server: -grant-log: writing %s: %v (counted in triage_quota_grant_log_errors_total)\n", path, err)
	})
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); gl.Run(ctx) }()
	return gl, func() { cancel(); <-done; f.Close() }, nil
}

// grantLogMetrics exports gl's counts.
func grantLogMetrics(gl *grantlog.Writer) []prometheus.Collector {
	stat := func(i int) func() float64 {
		return func() float64 {
			w, d, e := gl.Stats()
			return float64([3]uint64{w, d, e}[i])
		}
	}
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "triage_quota_grant_log_records_total", Help: "Grants written to the grant log."}, stat(0)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "triage_quota_grant_log_dropped_total", Help: "Leases not logged: the grant log's queue was full."}, stat(1)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "triage_quota_grant_log_errors_total", Help: "Grants lost to write errors of the grant log (a full disk)."}, stat(2)),
	}
}

// flagSet reports whether name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// etcdBeyondLoopback reports whether any of the comma-separated etcd
// endpoints (host:port, or a URL) is beyond loopback; a unix socket is
// not.
func etcdBeyondLoopback(endpoints string) bool {
	for _, e := range strings.Split(endpoints, ",") {
		e = strings.TrimSpace(e)
		if e == "" || strings.HasPrefix(e, "unix:") || strings.HasPrefix(e, "unixs:") {
			continue
		}
		if u, err := url.Parse(e); err == nil && u.Host != "" {
			e = u.Host
		}
		if _, _, err := net.SplitHostPort(e); err != nil {
			e = net.JoinHostPort(strings.Trim(e, "[]"), "2379")
		}
		if beyondLoopback(e) {
			return true
		}
	}
	return false
}

// dialEtcd returns a client of the comma-separated etcd endpoints, over
// TLS when files are named.
func dialEtcd(endpoints string, files tlsfiles.Files) (*clientv3.Client, error) {
	var eps []string
	for _, e := range strings.Split(endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return nil, errors.New("no endpoints")
	}
	cfg := clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if files.Set() {
		tc, err := files.Client()
		if err != nil {
			return nil, err
		}
		cfg.TLS = tc
	}
	return clientv3.New(cfg)
}

// policySource is where the policy comes from: a file, watched for
// changes, or an etcd key, watched by every replica.
type policySource struct {
	policy  *quota.Policy
	version int64
	where   string
	run     func(ctx context.Context, apply func(*quota.Policy, int64), refused func(int64, error))
}

func loadPolicySource(ctx context.Context, file string, reload time.Duration, cli *clientv3.Client, key string) (*policySource, error) {
	if key != "" {
		w, err := quotareplica.WatchPolicy(cli, key, triageyaml.ParseQuota)
		if err != nil {
			return nil, err
		}
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		p, rev, err := w.Load(lctx)
		if err != nil {
			return nil, err
		}
		return &policySource{policy: p, version: rev, where: "etcd key " + key,
			run: func(ctx context.Context, apply func(*quota.Policy, int64), refused func(int64, error)) {
				w.Run(ctx, rev, apply, refused)
			}}, nil
	}
	// A file's versions count its loads: 1 is the file at start-up.
	var version atomic.Int64
	version.Store(1)
	var apply atomic.Pointer[func(*quota.Policy, int64)]
	w, err := triageyaml.WatchQuota(file, func(p *quota.Policy) {
		if f := apply.Load(); f != nil {
			(*f)(p, version.Add(1))
		}
	}, triageyaml.WithWatchInterval(reload))
	if err != nil {
		return nil, err
	}
	p, err := triageyaml.LoadQuota(file)
	if err != nil {
		return nil, err
	}
	return &policySource{policy: p, version: 1, where: file,
		run: func(ctx context.Context, a func(*quota.Policy, int64), refused func(int64, error)) {
			apply.Store(&a)
			w.Run(ctx, func(err error) { refused(version.Load()+1, err) })
		}}, nil
}
