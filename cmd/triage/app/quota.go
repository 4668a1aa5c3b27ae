package app

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/quota/allocate"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/triagehq/triage/cmd/triage/internal/tlsfiles"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/quota/grantlog"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagegrpc/quotaservice"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotapb"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotareplica"
	"github.com/triagehq/triage/triageprom"
	"github.com/triagehq/triage/triageyaml"
)

// probes are the paths of a command's readiness and liveness probes, and
// its readiness handler (nil: triagehttp.HealthHandler of its lifecycle).
type probes struct {
	ready, live string
	readyH      http.Handler
}

// runQuotaServer serves the quota service (quotapb.Quota) until ctx is
// done: tasks report usage and get leases; the policy file is reloaded
// when it changes, and a bad one is refused with the last good one kept.
func runQuotaServer(ctx context.Context, args []string, stdout, stderr io.Writer, o *options) int {
	var f quotaServerFlags
	fs := flag.NewFlagSet("triage quota-server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs)
	if code, ok := o.parse(fs, args, stderr, &f.tls); !ok {
		return code
	}
	if f.configUsed {
		fmt.Fprintln(stderr, "triage quota-server: -config is deprecated: use -policy")
	}
	if !flagSet(fs, "bound-only") {
		f.boundOnly = len(f.binds) > 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "triage quota-server: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if err := f.check(); err != nil {
		fmt.Fprintf(stderr, "triage quota-server: %v\n", err)
		return 2
	}
	log, err := f.log.logger(stderr)
	if err != nil {
		fmt.Fprintf(stderr, "triage quota-server: %v\n", err)
		return 2
	}
	qs, code, err := f.build(ctx, log)
	if qs != nil {
		defer qs.close()
	}
	if err != nil {
		log.Error("quota-server cannot start", "err", err)
		return code
	}
	m, stop, err := o.startTelemetry(ctx, "quota-server", nil)
	if err == nil {
		defer stop()
		err = qs.report(m)
	}
	if err != nil {
		log.Error("quota-server cannot start its telemetry", "err", err)
		return 1
	}
	if err := qs.serve(ctx, &f, stdout, log); err != nil {
		log.Error("quota-server stopped", "err", err)
		return 1
	}
	return 0
}

// quotaServerFlags are triage quota-server's flags.
type quotaServerFlags struct {
	policy, listen, metrics, etcd, advertise  string
	electionPrefix, policyKey, grantLog, mode string
	lease, refresh, reload, drain             time.Duration
	tls, etcdTLS                              tlsfiles.Files
	binds                                     bindFlag
	boundOnly, insecureEtcd, unauthenticated  bool
	customers, configUsed                     bool
	grantLogBackups                           int
	sessionTTL                                time.Duration
	grantLogMax                               int64
	log                                       logFlags
}

func (f *quotaServerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.policy, "policy", "", "YAML quota policy file (see quota.Config); this or -policy-key is required")
	fs.Func("config", "deprecated spelling of -policy (-config is the edge file in the other commands)", func(v string) error {
		f.policy, f.configUsed = v, true
		return nil
	})
	fs.BoolVar(&f.customers, "metrics-customers", false, "label the quota metrics by customer (a customer's name can identify a person or a tenant; default: summed over the customers)")
	fs.StringVar(&f.listen, "listen", "127.0.0.1:7070", "gRPC listen address")
	fs.DurationVar(&f.lease, "lease", 30*time.Second, "how long a lease is valid")
	fs.DurationVar(&f.refresh, "refresh", 5*time.Second, "how often tasks renew their lease (jittered ±25% by each task)")
	fs.DurationVar(&f.reload, "reload", time.Second, "how often the policy file is checked for changes")
	fs.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics on this address (e.g. 127.0.0.1:9090); default none")
	f.tls.RegisterServer(fs, "", "tasks")
	f.binds = bindFlag{}
	fs.Var(f.binds, "bind", "IDENTITY=TASK: a task whose verified client certificate names IDENTITY reports as TASK (repeatable; needs -tls-client-ca). An identity not bound reports as itself")
	fs.BoolVar(&f.boundOnly, "bound-only", false, "with -tls-client-ca, refuse a caller none of whose identities -bind names, instead of letting it report as a task named after its identity (default true when -bind is given: under a mesh's or SPIFFE's CA any workload has an identity)")
	fs.BoolVar(&f.insecureEtcd, "insecure-etcd", false, "talk to -etcd endpoints beyond loopback without TLS (whoever reaches etcd writes the policy and the election)")
	fs.BoolVar(&f.unauthenticated, "unauthenticated", false, "accept reports from callers without a verified client certificate, their task ids believed as sent (needed to listen beyond loopback without -tls-client-ca)")
	fs.DurationVar(&f.drain, "drain", time.Second, "on SIGTERM, how long the service answers in lame duck (health NOT_SERVING) before it stops; calls still running 5 s later are cut")
	fs.StringVar(&f.etcd, "etcd", "", "comma-separated etcd endpoints: run as one of several replicas, the leader elected through etcd (quotareplica); default one process, no etcd")
	fs.StringVar(&f.advertise, "advertise", "", "with -etcd, the address tasks reach this replica at (told to tasks by the other replicas; required with -etcd)")
	fs.DurationVar(&f.sessionTTL, "session-ttl", quotareplica.DefaultSessionTTL*time.Second, "with -etcd, the etcd session TTL, whole seconds (etcd's unit): how long a dead leader holds the election")
	fs.StringVar(&f.electionPrefix, "election-prefix", quotareplica.DefaultElectionPrefix, "with -etcd, the etcd key prefix of the election (replicas of one service share it)")
	fs.StringVar(&f.policyKey, "policy-key", "", "with -etcd, the etcd key holding the YAML policy, instead of -policy: every replica watches it, refuses a bad push and keeps the last good policy")
	fs.StringVar(&f.grantLog, "grant-log", "", "append every share granted to this file, one JSON line each (an audit trail; quota/grantlog), written off the refresh path; its errors go to stderr and triage_quota_grant_log_errors_total")
	fs.Int64Var(&f.grantLogMax, "grant-log-max-bytes", 100<<20, "with -grant-log, rotate the file (to FILE.1, FILE.2, ...) before it passes this size")
	fs.IntVar(&f.grantLogBackups, "grant-log-backups", 5, "with -grant-log, how many rotated files to keep (0 to 100)")
	f.etcdTLS.RegisterClient(fs, "etcd-", "etcd")
	f.log.register(fs)
	fs.StringVar(&f.mode, "mode", "optimistic", "throttling mode: optimistic, or pessimistic (the tasks' shares of a limit never sum over 1; pair with tasks whose quota.Enforcer runs quota.ModePessimistic)")
}

// promMetrics returns the quota service's Prometheus metrics, labelled by
// customer with -metrics-customers.
func (f *quotaServerFlags) promMetrics() *triageprom.Metrics {
	if f.customers {
		return triageprom.New(triageprom.WithCustomers())
	}
	return triageprom.New()
}

// check refuses flags that contradict each other or are out of range.
func (f *quotaServerFlags) check() error {
	switch {
	case f.policy == "" && f.policyKey == "":
		return errors.New("-policy is required (or -policy-key with -etcd)")
	case f.policy != "" && f.policyKey != "":
		return errors.New("-policy and -policy-key contradict each other: the policy lives in one place")
	case f.etcd == "" && (f.policyKey != "" || f.advertise != "" || f.etcdTLS.Set()):
		return errors.New("-policy-key, -advertise and -etcd-tls-* need -etcd")
	case f.etcd != "" && f.advertise == "":
		return errors.New("-etcd needs -advertise, the address tasks reach this replica at")
	case f.etcd != "" && (f.sessionTTL < 2*time.Second || f.sessionTTL > time.Hour || f.sessionTTL%time.Second != 0):
		return fmt.Errorf("-session-ttl must be whole seconds from 2s to 1h (etcd's unit), got %v", f.sessionTTL)
	case f.refresh <= 0 || f.lease < f.refresh || f.lease > 24*time.Hour || f.reload <= 0:
		return errors.New("need 0 < -refresh <= -lease <= 24h and a positive -reload")
	case f.grantLog == "" && (f.grantLogMax != 100<<20 || f.grantLogBackups != 5):
		return errors.New("-grant-log-max-bytes and -grant-log-backups need -grant-log")
	case f.drain < 0 || f.drain > time.Hour:
		return errors.New("-drain must be between 0 and 1h")
	case f.etcd != "" && !f.etcdTLS.Set() && !f.insecureEtcd && etcdBeyondLoopback(f.etcd):
		return fmt.Errorf("-etcd %s is beyond loopback: give -etcd-tls-ca (and a client certificate) so that the policy and the election are not in the clear, or -insecure-etcd", f.etcd)
	}
	return f.checkAuth()
}

// checkAuth refuses a listener beyond loopback whose callers are not
// authenticated, and identity flags without verified certificates.
func (f *quotaServerFlags) checkAuth() error {
	switch {
	case len(f.binds) > 0 && f.tls.CA == "":
		return errors.New("-bind needs -tls-client-ca (identities come from verified client certificates)")
	case f.boundOnly && f.tls.CA == "":
		return errors.New("-bound-only needs -tls-client-ca (identities come from verified client certificates)")
	case f.tls.CA != "" && f.unauthenticated:
		return errors.New("-unauthenticated and -tls-client-ca contradict each other")
	case f.tls.CA == "" && !f.unauthenticated && beyondLoopback(f.listen):
		return fmt.Errorf("-listen %s is beyond loopback: give -tls-cert, -tls-key and -tls-client-ca so that tasks are authenticated, or -unauthenticated", f.listen)
	}
	return nil
}

// quotaServer is a built quota service, ready to serve: one process's
// Allocator, or a replica's.
type quotaServer struct {
	creds     []grpc.ServerOption
	svcOpts   []quotaservice.ServiceOption
	src       *policySource
	cli       *clientv3.Client
	server    quotapb.QuotaServer
	metrics   []prometheus.Collector
	setPolicy func(*quota.Policy, int64)
	runMore   func(context.Context) error // a replica's election, nil for one process
	closers   []func()
	alloc     *allocate.Allocator   // one process's
	replica   *quotareplica.Replica // or a replica
}

// report registers q with m's sink, if any, and adds its server options.
func (q *quotaServer) report(m *observers) error {
	if m.sink == nil {
		return nil
	}
	q.creds = append(q.creds, m.grpc()...)
	if q.replica != nil {
		return m.sink.QuotaReplica(q.replica)
	}
	return m.sink.QuotaService(q.alloc)
}

func (q *quotaServer) close() {
	for i := len(q.closers) - 1; i >= 0; i-- {
		q.closers[i]()
	}
}

// build makes the quota service the flags describe. On an error it
// returns the exit code; the caller closes q even then.
func (f *quotaServerFlags) build(ctx context.Context, log *slog.Logger) (q *quotaServer, code int, err error) {
	q = &quotaServer{}
	if err := f.credentials(q); err != nil {
		return q, 2, err
	}
	mode, err := quota.ParseMode(f.mode)
	if err != nil {
		return q, 2, fmt.Errorf("-mode: %w", err)
	}
	if f.etcd != "" {
		if q.cli, err = dialEtcd(f.etcd, f.etcdTLS); err != nil {
			return q, 2, fmt.Errorf("-etcd: %w", err)
		}
		q.closers = append(q.closers, func() { q.cli.Close() })
	}
	if q.src, err = loadPolicySource(ctx, f.policy, f.reload, q.cli, f.policyKey); err != nil {
		return q, 1, err
	}
	if f.grantLog != "" {
		gl, stop, err := startGrantLog(ctx, f.grantLog, f.grantLogMax, f.grantLogBackups, cmp.Or(f.advertise, f.listen), log)
		if err != nil {
			return q, 1, fmt.Errorf("-grant-log: %w", err)
		}
		q.closers = append(q.closers, stop)
		q.svcOpts = append(q.svcOpts, quotaservice.WithGrantLog(gl.Lease))
		q.metrics = grantLogMetrics(gl)
	}
	newAlloc := func(p *quota.Policy, extra ...allocate.Option) (*allocate.Allocator, error) {
		return allocate.New(p, append(extra, allocate.WithLease(f.lease), allocate.WithRefresh(f.refresh), allocate.WithMode(mode))...)
	}
	if q.cli == nil {
		alloc, err := newAlloc(q.src.policy)
		if err != nil {
			return q, 1, err
		}
		q.server = quotaservice.NewService(alloc, q.svcOpts...)
		q.metrics = append(q.metrics, f.promMetrics().QuotaService(alloc))
		q.alloc = alloc
		q.setPolicy = func(p *quota.Policy, _ int64) { alloc.SetPolicy(p) }
		return q, 0, nil
	}
	r, err := quotareplica.New(q.cli, f.advertise, q.src.policy, newAlloc, quotareplica.WithSessionTTL(int(f.sessionTTL/time.Second)),
		quotareplica.WithElectionPrefix(f.electionPrefix), quotareplica.WithServiceOptions(q.svcOpts...))
	if err != nil {
		return q, 2, err
	}
	r.SetPolicy(q.src.policy, q.src.version)
	q.server, q.setPolicy, q.runMore = r, r.SetPolicy, r.Run
	q.metrics = append(q.metrics, f.promMetrics().QuotaReplica(r))
	q.replica = r
	return q, 0, nil
}

// credentials sets q's TLS and the identities tasks report as.
func (f *quotaServerFlags) credentials(q *quotaServer) error {
	if f.tls.Set() {
		cfg, err := f.tls.Server()
		if err != nil {
			return err
		}
		q.creds = append(q.creds, grpc.Creds(credentials.NewTLS(cfg)))
	}
	if f.tls.CA != "" {
		q.svcOpts = append(q.svcOpts, quotaservice.WithTaskIdentities(f.binds))
		if f.boundOnly {
			q.svcOpts = append(q.svcOpts, quotaservice.WithBoundIdentitiesOnly())
		}
	}
	return nil
}

// serve serves q on f.listen until ctx ends, then drains: lame duck for
// -drain, and a replica resigns so that another takes over at once.
func (q *quotaServer) serve(ctx context.Context, f *quotaServerFlags, stdout io.Writer, log *slog.Logger) error {
	lis, err := net.Listen("tcp", f.listen)
	if err != nil {
		return err
	}
	gs := grpc.NewServer(append(q.creds, quotaservice.ServerOptions()...)...)
	quotapb.RegisterQuotaServer(gs, q.server)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	lc, err := triagegrpc.NewLifecycle(hs, lifecycle.WithDrain(f.drain))
	if err != nil {
		lis.Close()
		return err
	}
	if f.metrics != "" {
		reg := newRegistry()
		reg.MustRegister(q.metrics...)
		stopMetrics, err := serveMetrics(f.metrics, reg, lc)
		if err != nil {
			lis.Close()
			return err
		}
		defer stopMetrics()
	}
	go q.src.run(ctx, func(p *quota.Policy, version int64) {
		q.setPolicy(p, version)
		log.Info("policy in force", "version", version, "customers", len(p.Customers()))
	}, func(version int64, err error) {
		log.Warn("policy refused, keeping the last good one", "version", version, "err", err)
	})
	ranMore := make(chan struct{})
	if q.runMore != nil {
		go func() { defer close(ranMore); q.runMore(ctx) }()
	} else {
		close(ranMore)
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), f.drain+5*time.Second)
		defer cancel()
		lc.Shutdown(sctx, triagegrpc.GracefulStop(gs))
	}()
	fmt.Fprintf(stdout, "quota service listening on %s: %d customers (policy %s), lease %v, refresh %v, %s\n",
		lis.Addr(), len(q.src.policy.Customers()), q.src.where, f.lease, f.refresh, f.describe())
	if err := gs.Serve(lis); err != nil && !stoppedFirst(ctx, err) {
		return err
	}
	<-stopped
	<-ranMore
	return nil
}

// describe says how tasks are authenticated and how the service runs.
func (f *quotaServerFlags) describe() string {
	auth := "tasks authenticated by client certificate"
	if f.tls.CA == "" {
		auth = "tasks NOT authenticated"
	}
	how := "one process"
	if f.etcd != "" {
		how = fmt.Sprintf("a replica advertised as %s, leader elected through etcd %s", f.advertise, f.etcd)
	}
	return auth + ", " + how
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
// the file. Write errors are logged.
func startGrantLog(ctx context.Context, path string, maxBytes int64, backups int, name string, log *slog.Logger) (gl *grantlog.Writer, stop func(), err error) {
	f, err := grantlog.OpenFile(path, maxBytes, backups)
	if err != nil {
		return nil, nil, err
	}
	gl = grantlog.NewWriter(f, name, time.Now, func(err error) {
		log.Error("grant log write failed (counted in triage_quota_grant_log_errors_total)", "path", path, "err", err)
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
