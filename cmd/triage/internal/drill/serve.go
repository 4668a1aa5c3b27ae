package drill

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/quota/usage"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagegrpc/quotaservice"
	"github.com/triagehq/triage/trust"
	"github.com/triagehq/triage/wire"
)

// The roles of the stack, Figure 21-2: an HTTP frontend, backends A and B,
// and the DB frontend.
const (
	RoleFrontend = "frontend"
	RoleA        = "a"
	RoleB        = "b"
	RoleDB       = "db"
)

// Task is one task's configuration, passed on the command line of
// `triage serve ROLE`.
type Task struct {
	Role    string
	ID      string        // unique in the stack, e.g. "db-1"
	Index   int           // the task's index in its tier (its subsetting client id)
	Listen  string        // gRPC (HTTP for the frontend) address
	Stats   string        // address of the task's /stats endpoint
	Next    []string      // the next tier's addresses
	Slots   int           // worker slots: the machine's speed
	Work    time.Duration // how long a request holds a slot
	Protect bool          // triage on, or plain gRPC with naive retries
	Shadow  bool          // with Protect: every mechanism in shadow (package shadow)
	Quota   string        // the quota service (DB tasks, with Protect)
	// MemLimit is the request memory the task may hold: each request in
	// the task holds RequestMemory from its arrival in a handler; past the
	// limit the task dies, as a container's OOM killer would kill it.
	MemLimit int64
	// ForceShed are game-day drills started with the task (Protect only):
	// admission.Controller.ForceShed for each.
	ForceShed []ForceShed
	// MaxConns bounds the protected frontend's open connections
	// (connload.WithMaxOpen; more wait in the kernel's accept queue); 0:
	// no bound.
	MaxConns int
}

// ForceShed is a game-day drill: reject Fraction of the requests of Level
// for For (admission.Controller.ForceShed).
type ForceShed struct {
	Level    criticality.Level
	Fraction float64
	For      time.Duration
}

// ParseForceShed reads a drill written LEVEL:FRACTION:DURATION, e.g.
// SHEDDABLE_PLUS:0.5:10m.
func ParseForceShed(s string) (ForceShed, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return ForceShed{}, fmt.Errorf("force-shed %q: want LEVEL:FRACTION:DURATION, e.g. SHEDDABLE_PLUS:0.5:10m", s)
	}
	l, err := criticality.Parse(parts[0])
	if err != nil {
		return ForceShed{}, fmt.Errorf("force-shed %q: %v", s, err)
	}
	f, err := strconv.ParseFloat(parts[1], 64)
	if err != nil || !(f > 0 && f <= 1) {
		return ForceShed{}, fmt.Errorf("force-shed %q: fraction must be a number in (0, 1]", s)
	}
	d, err := time.ParseDuration(parts[2])
	if err != nil || d <= 0 || d > admission.MaxForceShed {
		return ForceShed{}, fmt.Errorf("force-shed %q: duration must be in (0, %v]", s, admission.MaxForceShed)
	}
	return ForceShed{Level: l, Fraction: f, For: d}, nil
}

// RequestMemory is what each request holds while it is in a handler: its
// payload and buffers.
const RequestMemory = 256 << 10

// ExitOOM is the exit status of a task that ran out of memory.
const ExitOOM = 137

// Validate checks a task's configuration.
func (t Task) Validate() error {
	switch {
	case t.Role != RoleFrontend && t.Role != RoleA && t.Role != RoleB && t.Role != RoleDB:
		return fmt.Errorf("unknown role %q (want frontend, a, b or db)", t.Role)
	case t.Stats == "":
		return errors.New("-stats is required")
	case t.Slots < 1 || t.Slots > 64:
		return fmt.Errorf("-slots %d out of [1, 64]", t.Slots)
	case t.Work < 0 || t.Work > time.Second:
		return fmt.Errorf("-work %v out of [0, 1s]", t.Work)
	case t.Role != RoleDB && len(t.Next) == 0:
		return errors.New("-next is required for every tier but the DB")
	case t.MemLimit < RequestMemory:
		return errors.New("-mem-limit too small")
	case len(t.ForceShed) > 0 && !t.Protect:
		return errors.New("-force-shed needs triage's protections (-protect)")
	case t.Shadow && !t.Protect:
		return errors.New("-shadow needs triage's protections (-protect)")
	case t.MaxConns < 0 || t.MaxConns > MaxFrontendConns:
		return fmt.Errorf("-max-conns %d out of [0, %d]", t.MaxConns, MaxFrontendConns)
	}
	return nil
}

// Stats is what a task reports on /stats.
type Stats struct {
	ID       string           `json:"id"`
	Role     string           `json:"role"`
	Slots    int              `json:"slots"`
	Busy     float64          `json:"busy"` // mean busy slots since the last read
	Served   uint64           `json:"served"`
	Degraded uint64           `json:"degraded"`
	Rejected map[string]int64 `json:"rejected"` // by reason, cumulative
	Attempts [4]uint64        `json:"attempts"` // requests received by attempt number
	Memory   int64            `json:"memory"`   // request memory held now
	// Usage and Limit per customer, CPU-seconds (slot-seconds) per second:
	// the DB tier's quota view.
	Usage map[string]float64 `json:"usage,omitempty"`
	Limit map[string]float64 `json:"limit,omitempty"`
	// Goroutines and LiveHeap are the process's (after a collection when
	// asked with ?gc=1): the drill checks that a task returns to its
	// baseline after a run.
	Goroutines int    `json:"goroutines"`
	LiveHeap   uint64 `json:"live_heap"`
	// Admission is the task's admission controller (with triage): its
	// pending cap, the requests it holds and its execution limit.
	Admission *AdmissionStats `json:"admission,omitempty"`
	// Spent is where the task's requests spent their time, by
	// criticality, summed since the task started.
	Spent map[string]Spent `json:"spent,omitempty"`
}

// AdmissionStats is a task's admission state when its stats are read.
type AdmissionStats struct {
	PendingCap float64 `json:"pending_cap"`
	Pending    int64   `json:"pending"`
	Limit      int64   `json:"limit"`
	Saturated  bool    `json:"saturated"`
	// ForceShed is, per criticality, the fraction a game-day drill rejects
	// now (only the levels with a drill in effect).
	ForceShed map[string]float64 `json:"force_shed,omitempty"`
}

// task is a running task's state.
type task struct {
	cfg      Task
	mach     *machine
	memory   atomic.Int64
	served   atomic.Uint64
	degraded atomic.Uint64
	attempts [4]atomic.Uint64
	spent    spending
	bufs     sync.Pool // of *[]byte, RequestMemory each: see hold
	rejMu    sync.Mutex
	rejected map[string]int64
	ctl      *admission.Controller
	enf      *quota.Enforcer
	leased   *quota.Leased
	died     chan struct{}
	dieOnce  sync.Once
	// slow is the slow fault: handlers' work is multiplied by slowBy
	// until slowUntil (unix nanoseconds).
	slowBy    atomic.Int64
	slowUntil atomic.Int64
}

func (t *task) reject(reason string) {
	t.rejMu.Lock()
	if len(t.rejected) < 64 || t.rejected[reason] > 0 {
		t.rejected[reason]++
	}
	t.rejMu.Unlock()
}

// hold takes a request's memory; past the limit the task dies. The
// memory is real (a buffer of RequestMemory bytes per request held), but
// reused from request to request: allocating and zeroing 256 KiB per
// request cost the host about a third of each task's CPU under the surge,
// which made the drill's two cores, not the emulated machines, its
// bottleneck (docs/drill-latency.md).
func (t *task) hold() func() {
	if t.memory.Add(RequestMemory) > t.cfg.MemLimit {
		t.dieOnce.Do(func() { close(t.died) })
	}
	buf, _ := t.bufs.Get().(*[]byte)
	if buf == nil {
		b := make([]byte, RequestMemory)
		buf = &b
	}
	(*buf)[0], (*buf)[len(*buf)-1] = 1, 1
	return func() {
		t.memory.Add(-RequestMemory)
		t.bufs.Put(buf)
	}
}

// Serve runs one task until ctx ends (SIGTERM: a clean shutdown, in lame
// duck first when protected) or the task runs out of memory (it then
// returns ErrOutOfMemory, and the process should exit with ExitOOM).
func Serve(ctx context.Context, cfg Task, stderr io.Writer) error {
	t := &task{cfg: cfg, mach: newMachine(cfg.Slots, cfg.Work), rejected: map[string]int64{}, died: make(chan struct{})}
	statsLn, err := net.Listen("tcp", cfg.Stats)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		statsLn.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", t.serveStats)
	mux.HandleFunc("POST /fault", t.serveFault)
	statsSrv := &http.Server{Handler: mux, ReadHeaderTimeout: time.Second}
	go statsSrv.Serve(statsLn)
	defer statsSrv.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next *grpc.ClientConn
	if len(cfg.Next) > 0 {
		if next, err = t.dial(); err != nil {
			return err
		}
		defer next.Close()
	}
	if cfg.Protect && cfg.Role != RoleFrontend {
		// The task's CPU is its machine's slots, which the Go runtime does
		// not see: admission gets one execution slot per machine slot (so
		// requests queue in admission, by criticality, not on the machine)
		// and the machine's busy share as its saturation signal.
		n := cfg.Slots
		if t.ctl, err = admission.New(admission.WithObserver(observer{t: t}), admission.WithLimits(n, n, n), admission.WithSaturation(t.mach)); err != nil {
			return err
		}
	}
	if cfg.Role == RoleDB && cfg.Protect && cfg.Quota != "" {
		if err := t.startQuota(ctx); err != nil {
			return err
		}
	}
	stop, err := t.serve(ln, next)
	if err != nil {
		return err
	}
	for _, d := range cfg.ForceShed {
		if err := t.ctl.ForceShed(d.Level, d.Fraction, d.For); err != nil {
			stop()
			return err
		}
		fmt.Fprintf(stderr, "%s: force-shedding %.0f%% of %v for %v\n", cfg.ID, 100*d.Fraction, d.Level, d.For)
	}
	select {
	case <-ctx.Done():
		stop()
		return nil
	case <-t.died:
		fmt.Fprintf(stderr, "%s: out of memory: %d requests held\n", cfg.ID, t.memory.Load()/RequestMemory)
		return ErrOutOfMemory
	}
}

// ErrOutOfMemory is returned by Serve when the task held more request
// memory than its limit.
var ErrOutOfMemory = errors.New("drill: task out of memory")

func (t *task) startQuota(ctx context.Context) error {
	// One address is one quota service; several are its replicas
	// (quotareplica), of which the client follows the leader.
	conns := map[string]grpc.ClientConnInterface{}
	for _, addr := range strings.Split(t.cfg.Quota, ",") {
		addr = strings.TrimSpace(addr)
		if addr == "" || conns[addr] != nil {
			continue
		}
		cc, err := grpc.NewClient("passthrough:///"+addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
			quotaservice.DialOptions(time.Second)...)...)
		if err != nil {
			return err
		}
		go func() { <-ctx.Done(); cc.Close() }()
		conns[addr] = cc
	}
	if len(conns) == 0 {
		return fmt.Errorf("drill: -quota %q names no address", t.cfg.Quota)
	}
	var cc grpc.ClientConnInterface
	var qopts []quotaservice.ClientOption
	if len(conns) == 1 {
		for _, c := range conns {
			cc = c
		}
	} else {
		qopts = append(qopts, quotaservice.WithReplicas(conns))
	}
	u, err := usage.New()
	if err != nil {
		return err
	}
	t.leased = quota.NewLeased(nil, nil)
	if t.enf, err = quota.NewEnforcer(t.leased, u, quota.WithOverload(t.ctl.Overloaded), quota.WithCapacity(0.9*float64(t.cfg.Slots))); err != nil {
		return err
	}
	qc, err := quotaservice.NewClient(cc, t.cfg.ID, u, t.leased, append(qopts, quotaservice.WithRefresh(time.Second))...)
	if err != nil {
		return err
	}
	go qc.Run(ctx)
	return nil
}

func (t *task) dial() (*grpc.ClientConn, error) {
	r := manual.NewBuilderWithScheme("drill")
	var eps []resolver.Endpoint
	for _, a := range t.cfg.Next {
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
	}
	r.InitialState(resolver.State{Endpoints: eps})
	opts := []grpc.DialOption{grpc.WithResolvers(r), grpc.WithTransportCredentials(insecure.NewCredentials())}
	if t.cfg.Protect {
		sc := fmt.Sprintf(`{"loadBalancingConfig": [{"triage": {"policy": "weighted_round_robin", "subsetSize": 2, "clientId": %d}}],
			"healthCheckConfig": {"serviceName": ""}}`, t.cfg.Index)
		opts = append(opts, grpc.WithDefaultServiceConfig(sc))
		// Besides "task overloaded", retry a call whose connection failed
		// (a task killed or restarting): within the budget, on another task.
		set, obs := t.shadowing()
		pol, err := retry.New(retry.WithObserver(observer{t: t}), retry.WithShadow(set, obs), retry.WithTracer(retrySpent{&t.spent}), retry.WithRetryable(func(err error) bool {
			_, overload := outcome.As(err)
			return !overload && status.Code(err) == codes.Unavailable
		}))
		if err != nil {
			return nil, err
		}
		// The next tier's tasks are the drill's own: every host is internal.
		caller, err := egress.New(egress.WithPolicy(pol), egress.WithInternal("*"))
		if err != nil {
			return nil, err
		}
		client, err := triagegrpc.NewClient(caller)
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.DialOptions()...)
	} else {
		opts = append(opts, grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"round_robin": {}}]}`),
			grpc.WithUnaryInterceptor(naiveRetry))
	}
	return grpc.NewClient(r.Scheme()+":///next", opts...)
}

// naiveRetry is what an unprotected client does: every failure is tried
// again at once, up to three attempts, at every layer.
func naiveRetry(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var err error
	for n := range 3 {
		octx := ctx
		if n > 0 {
			octx = metadata.AppendToOutgoingContext(ctx, wire.AttemptKey, attempt.Format(n))
		}
		if err = invoker(octx, method, req, reply, cc, opts...); err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// serve starts the task's server and returns its stop function.
func (t *task) serve(ln net.Listener, next *grpc.ClientConn) (func(), error) {
	if t.cfg.Role == RoleFrontend {
		return t.serveFrontend(ln, next)
	}
	handler := t.handler(next)
	if !t.cfg.Protect {
		s := grpc.NewServer()
		relay.RegisterFunc(s, handler)
		go func() {
			connectNext(next) // as the protected task does, so both runs start connected
			s.Serve(ln)
		}()
		return s.Stop, nil
	}
	meter, err := t.mach.meter(clock.Real())
	if err != nil {
		return nil, err
	}
	hs := health.NewServer()
	// A new task starts in lame duck: clients connect, but send nothing
	// until it is ready (its own connections to the next tier are up).
	lc, err := triagegrpc.NewLifecycle(hs, lifecycle.WithDrain(time.Second), lifecycle.WithWarmup())
	if err != nil {
		return nil, err
	}
	go func() {
		connectNext(next)
		lc.Ready()
	}()
	in := []intake.Option{intake.WithTrust(taskTrust()), intake.WithAdmission(t.ctl), intake.WithShadow(t.shadowing()),
		intake.WithTracer(quotaTrace{t})}
	if t.enf != nil {
		// The quota is the customer's share of the machine's slots: its
		// "CPU" is the slot time the requests held.
		cpu, err := cost.New(cost.WithCPU(t.mach.slotTime))
		if err != nil {
			return nil, err
		}
		in = append(in, intake.WithQuota(t.enf, cpu))
	}
	srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(in...), triagegrpc.WithLoadReports(meter), triagegrpc.WithLifecycle(lc))
	if err != nil {
		return nil, err
	}
	s := grpc.NewServer(srv.ServerOptions()...)
	healthpb.RegisterHealthServer(s, hs)
	relay.RegisterFunc(s, handler)
	go s.Serve(ln)
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		lc.Shutdown(sctx, triagegrpc.GracefulStop(s))
	}, nil
}

// taskTrust is whom a task trusts with criticality, customer and
// attempt: the drill's other tasks, on loopback, or from the partition
// faults' namespace (whose DB tasks see tier B at 10.201.N.1; untrusted,
// every request reached them without its customer, as "(other)").
func taskTrust() *trust.Policy {
	return trust.MustNew(trust.Config{Networks: []string{"127.0.0.0/8", partitionNet}})
}

// connectNext connects to the next tier and waits, at most 3 s, until
// the connection is ready: a task takes traffic only when it can pass it
// on.
func connectNext(next *grpc.ClientConn) {
	if next == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	next.Connect()
	for st := next.GetState(); st != connectivity.Ready && next.WaitForStateChange(ctx, st); st = next.GetState() {
	}
}

// handler is a gRPC tier's work: hold the request's memory, take a slot
// for the tier's work, call the next tier. The answer is "full", or
// "partial" when the DB answered from part of the corpus (degraded).
func (t *task) handler(next *grpc.ClientConn) relay.Func {
	return func(ctx context.Context, body string) (string, error) {
		defer t.hold()()
		n := attempt.Incoming(ctx)
		if !t.cfg.Protect { // no triage server: the counter is plain metadata
			n = 0
			if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get(wire.AttemptKey)) == 1 {
				n, _ = attempt.Parse(md.Get(wire.AttemptKey)[0])
			}
		}
		t.attempts[min(max(n, 0), 3)].Add(1)
		level := criticality.Of(ctx)
		if !t.cfg.Protect { // nothing told this task the request's criticality
			level = unlabelled
		}
		t.spent.handled(level)
		// Near its limit, the DB answers sheddable requests from part of
		// the corpus, at half the work: a degraded answer.
		work, out := t.cfg.Work*time.Duration(t.slowdown()), body
		if t.cfg.Role == RoleDB && t.ctl != nil && criticality.Of(ctx) < criticality.Critical &&
			(t.mach.current() >= 0.75 || t.ctl.Degrade(criticality.Of(ctx))) {
			work, out = work/2, "partial"
			t.degraded.Add(1)
		}
		// A customer is charged the slot-seconds its request held, not its
		// wait for a slot (quotas are in CPU): intake's quota meter reads
		// the machine's busy slot time, and run marks the wait for a slot.
		began := time.Now()
		held, err := t.mach.run(ctx, work)
		t.spent.add(level, partSlot, time.Since(began)-held)
		t.spent.add(level, partService, held)
		if err != nil {
			t.reject("deadline")
			return "", err
		}
		if next != nil {
			var err error
			began := time.Now()
			out, err = relay.Invoke(ctx, next, body)
			t.spent.add(level, partDownstream, time.Since(began))
			if err != nil {
				t.reject("downstream")
				return "", err
			}
		}
		t.served.Add(1)
		return out, nil
	}
}
