package drill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"runtime"
	"runtime/metrics"
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
	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/connload"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/shadow"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagegrpc/quotaservice"
	"github.com/triagehq/triage/triagehttp"
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

// machine emulates a task's machine: Slots workers, each request holding
// one for Work. Busy time is integrated for utilization.
type machine struct {
	slots chan struct{}
	work  time.Duration
	n     int

	now      func() time.Time
	mu       sync.Mutex
	busy     int
	busyArea float64 // slot-seconds since lastRead
	lastAt   time.Time
	lastRead time.Time
	ewma     float64 // busy slots, averaged with time constant reportTau
	ewmaAt   time.Time
}

// reportTau is the time constant of the busy share a task reports to its
// clients: about the interval a CPU utilization is measured over.
const reportTau = 500 * time.Millisecond

func newMachine(n int, work time.Duration) *machine {
	now := time.Now()
	return &machine{slots: make(chan struct{}, n), work: work, n: n, now: time.Now, lastAt: now, lastRead: now, ewmaAt: now}
}

func (m *machine) account(delta int) {
	m.mu.Lock()
	now := m.now()
	m.busyArea += float64(m.busy) * now.Sub(m.lastAt).Seconds()
	m.decay(now)
	m.busy += delta
	m.lastAt = now
	m.mu.Unlock()
}

// decay brings the average busy slots up to now. m.mu is held.
func (m *machine) decay(now time.Time) {
	if dt := now.Sub(m.ewmaAt); dt > 0 {
		a := math.Exp(-float64(dt) / float64(reportTau))
		m.ewma = m.ewma*a + float64(m.busy)*(1-a)
		m.ewmaAt = now
	}
}

// reported is the utilization a task reports in its load reports: its
// busy share over the last reportTau or so.
func (m *machine) reported() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.decay(m.now())
	return m.ewma / float64(m.n)
}

// run holds a slot for d (waiting for one first, until ctx ends). It
// returns the request's CPU on this machine: how long it held the slot,
// but never more than d, the work it did. A process frozen meanwhile
// (SIGSTOP) or a host too busy to fire the timer on time holds the slot
// longer, and does no more work for it.
func (m *machine) run(ctx context.Context, d time.Duration) (time.Duration, error) {
	select {
	case m.slots <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	m.account(+1)
	began := m.now()
	defer func() { m.account(-1); <-m.slots }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return min(m.now().Sub(began), d), nil
	case <-ctx.Done():
		return min(m.now().Sub(began), d), ctx.Err()
	}
}

// utilization returns the mean busy share of the slots since the last call.
func (m *machine) utilization() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	m.busyArea += float64(m.busy) * now.Sub(m.lastAt).Seconds()
	m.decay(now)
	m.lastAt = now
	span := now.Sub(m.lastRead).Seconds()
	area := m.busyArea
	m.busyArea, m.lastRead = 0, now
	if span <= 0 {
		return 0
	}
	return area / span / float64(m.n)
}

// Name and Utilization make the machine an signals.Signal: its busy
// share now.
func (m *machine) Name() string         { return "machine" }
func (m *machine) Utilization() float64 { return m.current() }

// current is the instantaneous busy share: the saturation signal
// admission reads, and the degradation threshold.
func (m *machine) current() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return float64(m.busy) / float64(m.n)
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

// observer counts the task's admission and client-side refusals among
// its rejections, by reason and criticality.
type observer struct {
	admission.Nop
	t *task
}

func (o observer) Rejected(l criticality.Level, r admission.Reason, _ bool) {
	o.t.reject("admission " + r.String() + " " + l.String())
}
func (o observer) Requested(criticality.Level)       {}
func (o observer) Answered(criticality.Level, bool)  {}
func (o observer) Throttled(l criticality.Level)     { o.t.reject("throttled " + l.String()) }
func (o observer) Retried(criticality.Level)         {}
func (o observer) BudgetRefused(l criticality.Level) { o.t.reject("retry budget " + l.String()) }
func (o observer) Exhausted(criticality.Level)       {}

// shadowObserver counts the task's would-be refusals in shadow among its
// rejections, marked "would": "would admission concurrency SHEDDABLE",
// "would throttle throttled CRITICAL", ...
type shadowObserver struct{ t *task }

func (o shadowObserver) WouldRefuse(m shadow.Mechanism, reason string, l criticality.Level) {
	o.t.reject("would " + m.String() + " " + reason + " " + l.String())
}

// shadowing returns the task's shadow options' arguments: every
// mechanism, when the task runs in shadow, else none.
func (t *task) shadowing() (shadow.Set, shadow.Observer) {
	if !t.cfg.Shadow {
		return 0, nil
	}
	return shadow.All(), shadowObserver{t}
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
	u, err := quota.NewUsage()
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
	meter, err := balance.NewMeter(balance.WithUtilization(t.mach.reported))
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
	srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(taskTrust()),
		intake.WithAdmission(t.ctl)), triagegrpc.WithLoadReports(meter), triagegrpc.WithLifecycle(lc), triagegrpc.WithIntake(intake.WithShadow(t.shadowing()),
		intake.WithTracer(intakeSpent{&t.spent})))
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
		var res quota.Reservation
		customer := quota.CustomerOf(ctx)
		enf := t.enf
		if enf != nil {
			var err error
			if res, err = enf.Reserve(customer, criticality.Of(ctx)); err != nil {
				if !t.cfg.Shadow {
					t.reject("out-of-quota " + criticality.Of(ctx).String() + " " + customer + " on " + t.cfg.ID)
					return "", err
				}
				shadowObserver{t}.WouldRefuse(shadow.Quota, "out-of-quota", criticality.Of(ctx))
				enf = nil // not charged, as it would not have run
			}
		}
		// A customer is charged the slot-seconds its request held, not its
		// wait for a slot: quotas are in CPU.
		began := time.Now()
		held, err := t.mach.run(ctx, work)
		t.spent.add(level, partSlot, time.Since(began)-held)
		t.spent.add(level, partService, held)
		if enf != nil {
			enf.Done(customer, criticality.Of(ctx), res, held)
		}
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

// The frontend's criticality rules: by path, as the CRE post suggests.
var frontendRules = edge.Config{Default: "CRITICAL", Rules: []edge.RuleConfig{
	{PathPrefix: "/checkout", Criticality: "CRITICAL_PLUS"},
	{PathPrefix: "/search", Criticality: "CRITICAL"},
	{PathPrefix: "/suggest", Criticality: "SHEDDABLE_PLUS"},
	{PathPrefix: "/prefetch", Criticality: "SHEDDABLE"},
}}

// Customers are identified at the frontend from their API key.
var apiKeys = map[string]string{"key-gmail": "gmail", "key-calendar": "calendar", "key-android": "android", "key-abuser": "abuser"}

// DefaultFrontendConns is the protected frontend's default bound on open
// connections (Task.MaxConns): each costs it a goroutine and buffers, and
// every request it sends costs it CPU to answer, refusals included, so
// that a population of clients past it would take the CPU its backends
// need (bench/cmd/frontendload).
const DefaultFrontendConns = 1000

// MaxFrontendConns bounds Task.MaxConns.
const MaxFrontendConns = 100000

// serveFrontend is the HTTP frontend: criticality by rules, customer by
// API key, one call to A per request.
func (t *task) serveFrontend(ln net.Listener, next *grpc.ClientConn) (func(), error) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer t.hold()()
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if c := apiKeys[r.Header.Get("X-Api-Key")]; c != "" {
			ctx = quota.NewContext(ctx, c)
		}
		l := criticality.Of(ctx)
		t.spent.handled(l)
		began := time.Now()
		out, err := relay.Invoke(ctx, next, "full")
		t.spent.add(l, partDownstream, time.Since(began))
		if err != nil {
			t.reject(reasonOf(err))
			if !triagehttp.WriteError(w, err) {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			return
		}
		t.served.Add(1)
		if out == "partial" {
			t.degraded.Add(1)
			w.Header().Set("X-Degraded", "1")
		}
		w.WriteHeader(http.StatusOK)
	})
	var handler http.Handler = h
	if t.cfg.Protect {
		ctl, err := admission.New(admission.WithObserver(observer{t: t}))
		if err != nil {
			return nil, err
		}
		t.ctl = ctl
		cl, err := edge.New(frontendRules)
		if err != nil {
			return nil, err
		}
		mw, err := triagehttp.Middleware(triagehttp.WithIntake(intake.WithClassifier(cl)), triagehttp.WithAdmission(ctl), triagehttp.WithIntake(intake.WithShadow(t.shadowing()),
			intake.WithTracer(intakeSpent{&t.spent})))
		if err != nil {
			return nil, err
		}
		handler = mw(h)
	} else {
		// Unprotected, criticality still travels (it is how the traffic is
		// labelled), but nothing acts on it.
		cl, _ := edge.New(frontendRules)
		mw, err := triagehttp.Middleware(triagehttp.WithIntake(intake.WithClassifier(cl)))
		if err != nil {
			return nil, err
		}
		handler = mw(h)
	}
	if t.cfg.Protect && t.cfg.MaxConns > 0 {
		cl, err := connload.NewListener(ln, connload.WithMaxOpen(t.cfg.MaxConns))
		if err != nil {
			return nil, err
		}
		ln = cl
	}
	s := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second, ConnContext: triagehttp.ConnContext}
	lc, err := lifecycle.New(lifecycle.WithDrain(time.Second))
	if err != nil {
		return nil, err
	}
	unsubscribe := triagehttp.Announce(lc, s)
	go func() {
		connectNext(next) // connections wait in the listen queue meanwhile
		s.Serve(ln)
	}()
	return func() {
		defer unsubscribe()
		sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		lc.Shutdown(sctx, triagehttp.Shutdown(s))
	}, nil
}

// reasonOf names an error for the rejection counts.
func reasonOf(err error) string {
	if oe, ok := outcome.As(err); ok {
		return oe.Kind.Token()
	}
	if errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "DeadlineExceeded") {
		return "deadline"
	}
	return "error"
}

// slowdown is the factor the slow fault multiplies the work by now (1
// without it).
func (t *task) slowdown() int64 {
	if time.Now().UnixNano() < t.slowUntil.Load() {
		return max(1, t.slowBy.Load())
	}
	return 1
}

// MaxSlowFactor and MaxSlowFor bound the slow fault: its factor and how
// long it lasts.
const (
	MaxSlowFactor = 100
	MaxSlowFor    = 5 * time.Minute
)

// serveFault is the task's fault knob, for the drill's fault harness on
// its stats address: POST /fault?slow=F&for=D makes the handlers F times
// slower for D (F 1 restores the speed at once); POST
// /fault?shed=LEVEL:FRACTION:DURATION starts a ForceShed drill (FRACTION 0
// is not accepted: a drill ends at its time, or replaced by a shorter one).
func (t *task) serveFault(w http.ResponseWriter, r *http.Request) {
	if spec := r.URL.Query().Get("shed"); spec != "" {
		d, err := ParseForceShed(spec)
		if err == nil && t.ctl == nil {
			err = errors.New("no admission control on this task")
		}
		if err == nil {
			err = t.ctl.ForceShed(d.Level, d.Fraction, d.For)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%s: force-shedding %.0f%% of %v for %v\n", t.cfg.ID, 100*d.Fraction, d.Level, d.For)
		return
	}
	f, err := strconv.Atoi(r.URL.Query().Get("slow"))
	if err != nil || f < 1 || f > MaxSlowFactor {
		http.Error(w, fmt.Sprintf("slow must be an integer in [1, %d]", MaxSlowFactor), http.StatusBadRequest)
		return
	}
	d, err := time.ParseDuration(r.URL.Query().Get("for"))
	if err != nil || d <= 0 || d > MaxSlowFor {
		http.Error(w, fmt.Sprintf("for must be a duration in (0, %v]", MaxSlowFor), http.StatusBadRequest)
		return
	}
	t.slowBy.Store(int64(f))
	t.slowUntil.Store(time.Now().Add(d).UnixNano())
	fmt.Fprintf(w, "%s: handlers %dx slower for %v\n", t.cfg.ID, f, d)
}

func (t *task) serveStats(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("gc") == "1" {
		runtime.GC() // twice: the first moves the buffers hold keeps for reuse aside, the second frees them
		runtime.GC()
	}
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	s := Stats{ID: t.cfg.ID, Role: t.cfg.Role, Slots: t.cfg.Slots, Busy: t.mach.utilization() * float64(t.cfg.Slots),
		Served: t.served.Load(), Degraded: t.degraded.Load(), Memory: t.memory.Load(), Rejected: map[string]int64{},
		Goroutines: runtime.NumGoroutine(), Spent: t.spent.snapshot()}
	if live[0].Value.Kind() == metrics.KindUint64 {
		s.LiveHeap = live[0].Value.Uint64()
	}
	for i := range s.Attempts {
		s.Attempts[i] = t.attempts[i].Load()
	}
	t.rejMu.Lock()
	for k, v := range t.rejected {
		s.Rejected[k] = v
	}
	t.rejMu.Unlock()
	if t.ctl != nil {
		a := t.ctl.Stats()
		s.Admission = &AdmissionStats{PendingCap: a.PendingCap, Pending: a.Pending, Limit: a.Limit, Saturated: a.Saturated}
		for l, f := range a.Forced {
			if f > 0 {
				if s.Admission.ForceShed == nil {
					s.Admission.ForceShed = map[string]float64{}
				}
				s.Admission.ForceShed[criticality.Level(l).String()] = f
			}
		}
	}
	if t.enf != nil {
		s.Usage, s.Limit = map[string]float64{}, map[string]float64{}
		for _, c := range t.enf.Usage().Snapshot() {
			var used float64
			for _, v := range c.Used {
				used += v
			}
			s.Usage[c.Customer] = used
		}
		for c := range apiKeys {
			name := apiKeys[c]
			if lim, _ := t.leased.Limit(name, criticality.Sheddable); lim < 1e9 {
				s.Limit[name] = lim
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(s)
}
