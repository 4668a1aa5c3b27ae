// Package drill is `triage demo`: the overload drill of the SRE book's
// chapter 21 and the CRE post, on real sockets. A stack of processes (an
// HTTP frontend, gRPC backends A and B, the DB frontend: Figure 21-2, three
// tasks per gRPC tier on machines of two speeds, and the quota service)
// serves a provisioned rate; the script then throws ten times that at it,
// restarts one tier task by task, kills a DB task with SIGKILL, and lets
// it recover. The drill runs twice on the same traffic: with triage's
// protections (admission control, criticality, client throttling, retry
// budgets, weighted round robin over deterministic subsets, lame duck,
// quotas, degraded answers) and without them (plain gRPC, round robin,
// every failure retried at once at every layer, unbounded queues). Each
// task holds memory for every request in its handlers and dies, as under
// a container's OOM killer, past its limit; the drill restarts dead tasks
// after 2 s, as a cluster manager would.
//
// Every process is started by the drill and stopped by it, also on
// Ctrl-C (and killed with the drill, through Pdeathsig, if the drill
// itself dies). Every load loop is bounded in time.
package drill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/triagehq/triage/criticality"
)

// Options configure a drill.
type Options struct {
	// Duration is the whole drill, both runs (default 2 minutes; at
	// least 20 s).
	Duration time.Duration
	// Out is the directory for result.json and report.html ("": a new
	// temporary directory).
	Out string
	// Serve, if set, serves the live view as a web page on this address.
	Serve string
	// Command returns the command that runs `triage ARGS...` (a task is
	// `serve ROLE ...`, the quota service `quota-server ...`).
	Command func(args ...string) *exec.Cmd
	// Stdout receives the live view and the summary; Quiet prints one
	// line per second instead of redrawing.
	Stdout io.Writer
	Quiet  bool
	// Runs selects the runs: nil means both, protected first.
	Runs []bool
	// Shadow adds a run of the overload drill (not the faults) after them,
	// with triage's stack and every refusing mechanism in shadow (package
	// shadow), each as long as the others; Result.Shadow compares what it
	// would have refused with what the protected run refused.
	Shadow bool
	// protect and inShadow are one run's: with triage, and in shadow.
	protect, inShadow bool
	// Rounds repeats the drill (each round lasting Duration); with two or
	// more, the result also gives each run's medians over the rounds.
	// Default 1, at most MaxRounds.
	Rounds int
	// Faults, if set, runs these fault scenarios (Faults() names them)
	// instead of the overload drill: each a run of its own, with and
	// without triage, whose length the fault sets (Duration is unused).
	Faults []string
	// LateOK records answers past the user's timeout (Ledger.Late) without
	// failing the run: on a machine shared with other work, their lateness
	// measures the machine, not the stack. The ledger must still balance.
	LateOK bool
}

// MaxRounds bounds Options.Rounds.
const MaxRounds = 9

// ProvisionedRate is the rate the stack is provisioned for, requests per
// second at the frontend: the DB tier (the bottleneck) runs at 40% of its
// capacity there, so it survives the loss of its biggest task.
const ProvisionedRate = 100

// A class of user request.
type class struct {
	path, key    string
	level        criticality.Level
	normal, peak float64 // requests per second
}

// The traffic: critical traffic stays within what the stack is
// provisioned for, as the book assumes; the surge is sheddable traffic and
// an abusive customer.
var classes = []class{
	{"/checkout", "key-gmail", criticality.CriticalPlus, 10, 10},
	{"/search", "key-gmail", criticality.Critical, 20, 20},
	{"/search", "key-calendar", criticality.Critical, 10, 10},
	{"/search", "key-android", criticality.Critical, 10, 10},
	{"/suggest", "key-android", criticality.SheddablePlus, 25, 250},
	{"/prefetch", "key-calendar", criticality.Sheddable, 25, 500},
	{"/suggest", "key-abuser", criticality.SheddablePlus, 0, 200},
}

// quotaPolicy is the quota service's policy, in slot-seconds per second of
// the DB tier (10 slots): soft limits, enforced while a task is
// overloaded.
const quotaPolicy = `tasks: 3
fallback: safe
customers:
  gmail: {cpu: 5}
  calendar: {cpu: 2}
  android: {cpu: 2}
  abuser: {cpu: 0.5}
default: {cpu: 0.5}
`

// A phase of a run's script: its length (a share of the run, or a fixed
// duration) and its load.
type phase struct {
	name, says string
	share      float64       // of the run, when dur is 0
	dur        time.Duration // fixed length
	load       float64       // multiple of the provisioned rate: 1 normal, peakLoad the surge
}

// peakLoad is the surge's load: every class at its peak rate.
const peakLoad = 10

// rate is the class's rate at a load: its normal rate at 1, its peak at
// peakLoad, in proportion between (the excess is the surge's traffic:
// sheddable requests and the abusive customer).
func (c class) rate(load float64) float64 {
	return c.normal + (load-1)/(peakLoad-1)*(c.peak-c.normal)
}

// A scenario is what a run does: its phases, and the action the driver
// takes as each starts.
type scenario struct {
	fault  *fault // nil for the overload drill
	phases []phase
	act    func(dr *driver, phase string)
}

// drillScenario is the overload drill.
var drillScenario = &scenario{phases: []phase{
	{name: "normal", says: "normal load: the provisioned rate, 100 requests/s", share: 0.12, load: 1},
	{name: "surge", says: "surge: 10x the provisioned rate (sheddable traffic and an abusive customer)", share: 0.22, load: peakLoad},
	{name: "restart", says: "rolling restart of tier B, one task at a time (lame duck, then a new task), under the surge", share: 0.22, load: peakLoad},
	{name: "kill", says: "SIGKILL of the DB's biggest task, under the surge", share: 0.14, load: peakLoad},
	{name: "recovery", says: "recovery: normal load; the killed task comes back", share: 0.30, load: 1},
}, act: (*driver).actDrill}

// warmup is how long the stack serves normal load before the drill.
const warmup = 3 * time.Second

// tierSpec is a gRPC tier: each task's slots (its machine's speed) and the
// time a request holds one.
type tierSpec struct {
	role  string
	slots []int
	work  time.Duration
}

var tiers = []tierSpec{
	{RoleDB, []int{4, 4, 2}, 40 * time.Millisecond},
	{RoleB, []int{4, 2, 4}, 4 * time.Millisecond},
	{RoleA, []int{4, 4, 2}, 2 * time.Millisecond},
}

// Run performs the drill and returns its result; the result and the
// report are also written to Options.Out.
func Run(ctx context.Context, o Options) (*Result, error) {
	scenarios, err := o.defaults()
	if err != nil {
		return nil, err
	}
	v := newView(o.Stdout, o.Quiet)
	if o.Serve != "" {
		stop, err := v.serve(o.Serve)
		if err != nil {
			return nil, err
		}
		defer stop()
		v.printf("live view on http://%s/\n", o.Serve)
	}
	res := &Result{ProvisionedRate: ProvisionedRate, Dir: o.Out}
	unbalanced, err := runAll(ctx, &o, scenarios, v, res)
	if err != nil {
		return res, err
	}
	if len(o.Faults) > 0 {
		res.Faults = faultRows(res.Runs)
		if o.Rounds > 1 {
			res.FaultMedians = faultMedians(res.Faults)
		}
	} else if o.Rounds > 1 {
		res.Medians = medians(res.Runs)
	}
	if err := res.write(o.Out); err != nil {
		return res, err
	}
	v.printf("\n%s\nresult: %s\nreport: %s\n", res.Summary(), filepath.Join(o.Out, "result.json"), filepath.Join(o.Out, "report.html"))
	return res, errors.Join(unbalanced...)
}

// defaults checks o, fills in its defaults and its output directory, and
// returns the scenarios it names.
func (o *Options) defaults() ([]*scenario, error) {
	if o.Duration == 0 {
		o.Duration = 2 * time.Minute
	}
	if o.Rounds == 0 {
		o.Rounds = 1
	}
	switch {
	case o.Duration < 20*time.Second || o.Duration > time.Hour:
		return nil, errors.New("drill: duration must be between 20s and 1h")
	case o.Command == nil:
		return nil, errors.New("drill: Options.Command is required")
	case o.Rounds < 1 || o.Rounds > MaxRounds:
		return nil, fmt.Errorf("drill: rounds must be between 1 and %d", MaxRounds)
	}
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	if o.Runs == nil {
		o.Runs = []bool{true, false}
	}
	scenarios := []*scenario{drillScenario}
	if len(o.Faults) > 0 {
		var err error
		if scenarios, err = faultScenarios(o.Faults); err != nil {
			return nil, err
		}
	}
	if o.Out == "" {
		dir, err := os.MkdirTemp("", "triage-drill-")
		if err != nil {
			return nil, err
		}
		o.Out = dir
	} else if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	return scenarios, nil
}

// runAll runs every round of every scenario, with and without triage as
// o.Runs says, into res. A run whose checks fail is kept and its error
// returned in unbalanced: the runs go on, and are written, before the
// drill fails; any other error stops the drill.
func runAll(ctx context.Context, o *Options, scenarios []*scenario, v *view, res *Result) (unbalanced []error, err error) {
	perRun := o.Duration / time.Duration(len(o.Runs))
	for round := 1; round <= o.Rounds; round++ {
		for _, sc := range scenarios {
			for _, ro := range runsOf(*o, sc) {
				r, err := runOnce(ctx, ro, sc, perRun, v)
				if r == nil && errors.Is(err, errSkipped) {
					v.printf("  %v\n", err)
					res.Skipped = appendOnce(res.Skipped, err.Error())
					continue
				}
				if r != nil {
					if o.Rounds > 1 {
						r.Round = round
						r.Name = fmt.Sprintf("%s, round %d", r.Name, round)
					}
					res.Runs = append(res.Runs, r)
				}
				if errors.Is(err, errChecks) {
					v.printf("  %v\n", err)
					unbalanced = append(unbalanced, err)
				} else if err != nil {
					return unbalanced, err
				}
			}
		}
	}
	res.ShadowRows = compareShadow(res.Runs)
	return unbalanced, nil
}

// runsOf returns the options of each run of scenario sc: one per o.Runs,
// then, with o.Shadow and for the overload drill, one with triage's
// stack in shadow.
func runsOf(o Options, sc *scenario) []Options {
	var out []Options
	for _, protect := range o.Runs {
		ro := o
		ro.protect = protect
		out = append(out, ro)
	}
	if o.Shadow && sc.fault == nil {
		ro := o
		ro.protect, ro.inShadow = true, true
		out = append(out, ro)
	}
	return out
}

// proc is one process of the stack.
type proc struct {
	name    string
	args    []string
	stats   string
	netns   bool // it runs in the stack's network namespace (stack.net)
	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when the current process exits
	stopped bool          // the drill stopped it: not a death
	err     error
}

// alive reports whether p's process is running.
func (p *proc) alive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

type stack struct {
	o      Options
	procs  []*proc
	byName map[string]*proc
	deaths chan death
	log    *os.File
	// net, when set, puts the DB tier in a network namespace of its own
	// (the partition faults), with the quota service on the drill's side
	// of the link.
	net *netns
}

// death is a task that exited without being asked to.
type death struct {
	name string
	oom  bool // out of memory (ExitOOM), else it crashed
}

// ports hands out loopback ports for the stack: outside the kernel's
// ephemeral range (32768-60999 by default), so that no outgoing connection
// takes one while its task restarts, each checked free and never handed
// out twice.
type ports struct {
	next int
	used map[int]bool
}

func newPorts() *ports {
	return &ports{next: 20000 + int(time.Now().UnixNano()%8000), used: map[int]bool{}}
}

func (p *ports) get() (string, error) { return p.getOn("127.0.0.1") }

// getOn returns a free port on host (checked on 127.0.0.1: the drill's
// namespaces use the same range).
func (p *ports) getOn(host string) (string, error) {
	for range 4000 {
		port := p.next
		p.next++
		if p.next >= 32000 {
			p.next = 20000
		}
		if p.used[port] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		p.used[port] = true
		return net.JoinHostPort(host, strconv.Itoa(port)), nil
	}
	return "", errors.New("drill: no free loopback port in 20000-32000")
}

func (s *stack) start(p *proc) error {
	cmd := s.o.Command(p.args...)
	if p.netns && s.net != nil {
		cmd = inNetns(cmd, s.net)
	}
	cmd.Stdout, cmd.Stderr = s.log, s.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done, p.stopped = cmd, done, false
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		stopped := p.stopped
		p.mu.Unlock()
		close(done)
		if !stopped {
			select {
			case s.deaths <- death{name: p.name, oom: cmd.ProcessState != nil && cmd.ProcessState.ExitCode() == ExitOOM}:
			default:
			}
		}
	}()
	return nil
}

// ready waits for p's stats endpoint (or /healthz of the quota service:
// any answer will do).
func (s *stack) ready(ctx context.Context, p *proc) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if p.stats != "" {
			if resp, err := http.Get("http://" + p.stats + "/stats"); err == nil {
				resp.Body.Close()
				return nil
			}
		} else {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.done:
			return fmt.Errorf("%s exited at start: %v", p.name, p.err)
		case <-time.After(50 * time.Millisecond): // polling a starting process
		}
	}
	return fmt.Errorf("%s did not start within 15s", p.name)
}

// stop stops p: SIGTERM (a clean shutdown), then SIGKILL after 8 s.
func (s *stack) stop(p *proc, sig syscall.Signal) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.stopped = true
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(8 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

func (s *stack) stopAll() {
	var wg sync.WaitGroup
	for _, p := range s.procs {
		wg.Add(1)
		go func() { defer wg.Done(); s.stop(p, syscall.SIGTERM) }()
	}
	wg.Wait()
}

// errChecks is wrapped by the error of a run whose ledger does not
// balance or whose tasks did not return to their baseline.
var errChecks = errors.New("drill: a run's checks failed")

// errSkipped is wrapped by the error of a fault this machine cannot
// inject (a partition without root, say): the other runs go on.
var errSkipped = errors.New("drill: fault skipped")

func appendOnce(xs []string, x string) []string {
	for _, y := range xs {
		if y == x {
			return xs
		}
	}
	return append(xs, x)
}

func runOnce(ctx context.Context, o Options, sc *scenario, d time.Duration, v *view) (*RunResult, error) {
	protect := o.protect
	name, quotaSvc := "with triage", ", quota service"
	switch {
	case !protect:
		name, quotaSvc = "without triage", ""
	case o.inShadow:
		name = "triage in shadow"
	}
	if sc.fault != nil {
		name = sc.fault.name + ", " + name
	}
	s := &stack{o: o, byName: map[string]*proc{}, deaths: make(chan death, 64)}
	if sc.fault != nil && sc.fault.setup != nil {
		undo, err := sc.fault.setup(s)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", errSkipped, sc.fault.name, err)
		}
		defer undo()
	}
	v.printf("\n== run %q: starting the stack (HTTP frontend, 3 A, 3 B, 3 DB tasks%s)\n", name, quotaSvc)
	logf, err := os.Create(filepath.Join(o.Out, "tasks-"+strings.NewReplacer(" ", "-", ",", "").Replace(name)+".log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	s.log = logf
	defer s.stopAll()
	frontAddr, err := s.build(ctx, protect)
	if err != nil {
		return nil, err
	}
	run := newRun(name, protect, s.taskNames())
	run.Shadow = o.inShadow
	if sc.fault != nil {
		run.Fault = sc.fault.name
	}
	lg := newLoad("http://"+frontAddr, run)
	defer lg.close()
	// The stack serves normal load for a while before the drill starts.
	v.printf("  warming up: %v of normal load\n", warmup)
	runCtx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	dr := &driver{s: s, sc: sc, run: run, v: v, d: d, runCtx: runCtx, start: time.Now().Add(warmup), lateOK: o.LateOK,
		restarts: make(chan string, 16), restarted: make(chan struct{}), killed: make(chan struct{})}
	dr.phaseEnds = phaseEnds(sc.phases, d)
	dr.d = dr.phaseEnds[len(dr.phaseEnds)-1]
	return dr.drive(ctx, lg)
}

// phaseEnds returns when each phase of a run of length d ends, on whole
// seconds, so that each of the run's seconds belongs to one phase.
func phaseEnds(phases []phase, d time.Duration) []time.Duration {
	var ends []time.Duration
	acc := time.Duration(0)
	for _, ph := range phases {
		if ph.dur > 0 {
			acc += ph.dur
		} else {
			acc += time.Duration(ph.share * float64(d))
		}
		ends = append(ends, acc.Round(time.Second))
	}
	return ends
}

// build starts the stack's processes: the quota service (with triage),
// the tiers from the DB up, then the frontend, and waits for each to be
// ready. It returns the frontend's address.
func (s *stack) build(ctx context.Context, protect bool) (string, error) {
	pp := newPorts()
	quotaAddr := ""
	if protect {
		var err error
		if quotaAddr, err = s.startQuota(pp); err != nil {
			return "", err
		}
	}
	next := []string{}
	for _, t := range tiers {
		addrs, err := s.addTier(pp, t, next, protect, quotaAddr)
		if err != nil {
			return "", err
		}
		next = addrs
	}
	frontAddr, err := pp.get()
	if err != nil {
		return "", err
	}
	fstats, err := pp.get()
	if err != nil {
		return "", err
	}
	fp := &proc{name: "frontend-0", stats: fstats, args: []string{"serve", RoleFrontend, "-id", "frontend-0", "-listen", frontAddr, "-stats", fstats,
		"-slots", "64", "-work", "0s", "-protect=" + strconv.FormatBool(protect), "-shadow=" + strconv.FormatBool(s.o.inShadow), "-next", strings.Join(next, ",")}}
	s.procs, s.byName[fp.name] = append(s.procs, fp), fp
	for _, p := range s.procs {
		if p.name == "quota" {
			continue
		}
		if err := s.start(p); err != nil {
			return "", err
		}
		if err := s.ready(ctx, p); err != nil {
			return "", err
		}
	}
	return frontAddr, nil
}

// startQuota writes the quota policy and starts the quota service.
func (s *stack) startQuota(pp *ports) (string, error) {
	policy := filepath.Join(s.o.Out, "quota.yaml")
	if err := os.WriteFile(policy, []byte(quotaPolicy), 0o644); err != nil {
		return "", err
	}
	host := "127.0.0.1"
	if s.net != nil {
		host = s.net.hostIP
	}
	addr, err := pp.getOn(host)
	if err != nil {
		return "", err
	}
	args := []string{"quota-server", "-policy", policy, "-listen", addr, "-lease", "5s", "-refresh", "1s"}
	if s.net != nil {
		// On the drill's own veth pair, reachable from this machine only:
		// the tasks are the drill's, as they are on loopback.
		args = append(args, "-unauthenticated")
	}
	q := &proc{name: "quota", args: args}
	if err := s.start(q); err != nil {
		return "", err
	}
	s.procs = append(s.procs, q)
	return addr, nil
}

// addTier adds the tasks of tier t, calling next, and returns their
// addresses.
func (s *stack) addTier(pp *ports, t tierSpec, next []string, protect bool, quotaAddr string) ([]string, error) {
	var addrs []string
	for i, slots := range t.slots {
		id := fmt.Sprintf("%s-%d", t.role, i)
		host, ns := "127.0.0.1", false
		if s.net != nil && s.net.runsIn(t.role, id) {
			host, ns = s.net.nsIP, true
		}
		listen, err := pp.getOn(host)
		if err != nil {
			return nil, err
		}
		stats, err := pp.getOn(host)
		if err != nil {
			return nil, err
		}
		args := []string{"serve", t.role, "-id", id, "-index", strconv.Itoa(i), "-listen", listen, "-stats", stats,
			"-slots", strconv.Itoa(slots), "-work", t.work.String(), "-protect=" + strconv.FormatBool(protect), "-shadow=" + strconv.FormatBool(s.o.inShadow)}
		if len(next) > 0 {
			args = append(args, "-next", strings.Join(next, ","))
		}
		if t.role == RoleDB && protect {
			args = append(args, "-quota", quotaAddr)
		}
		p := &proc{name: id, args: args, stats: stats, netns: ns}
		s.procs, s.byName[id] = append(s.procs, p), p
		addrs = append(addrs, listen)
	}
	return addrs, nil
}

// driver runs one run's script beside its load: the actions at phase
// starts, restarts of dead tasks, polling and the live view.
type driver struct {
	s         *stack
	sc        *scenario
	run       *RunResult
	v         *view
	d         time.Duration
	runCtx    context.Context
	start     time.Time
	phaseEnds []time.Duration
	actions   sync.WaitGroup
	restarts  chan string // dead tasks restarted
	restarted chan struct{}
	killed    chan struct{}
	lateOK    bool // Options.LateOK
}

// phaseStart returns when phase i starts.
func (dr *driver) phaseStart(i int) time.Duration {
	if i == 0 {
		return 0
	}
	return dr.phaseEnds[i-1]
}

// phase returns the index of the script's phase at el.
func (dr *driver) phase(el time.Duration) int {
	for i, end := range dr.phaseEnds {
		if el < end {
			return i
		}
	}
	return len(dr.sc.phases) - 1
}

// drive runs the load and the script until the load ends or ctx does.
func (dr *driver) drive(ctx context.Context, lg *load) (*RunResult, error) {
	select {
	case <-time.After(warmup): // the load generator warms the stack up meanwhile
	case <-ctx.Done():
	}
	baseline := dr.s.stats(true)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		lg.run(dr.runCtx, dr.start, func(el time.Duration) float64 {
			if el < 0 || el >= dr.phaseEnds[len(dr.phaseEnds)-1] {
				return 1 // the warm-up
			}
			return dr.sc.phases[dr.phase(el)].load
		}, dr.phaseEnds[len(dr.phaseEnds)-1])
	}()
	curPhase := -1
	for {
		select {
		case <-ctx.Done():
			dr.s.stopAll()
			<-loadDone
			return dr.run, ctx.Err()
		case d := <-dr.s.deaths:
			how := "out of memory"
			if !d.oom {
				how = "crashed; see the tasks' log"
			}
			dr.run.died(d.name+" ("+how+")", time.Since(dr.start))
			dr.v.printf("  %s died (%s); restarting it in 2 s\n", d.name, how)
			dr.restartDead(d.name)
		case name := <-dr.restarts:
			dr.v.printf("  %s restarted\n", name)
		case <-loadDone:
			dr.actions.Wait()
			dr.run.finish(time.Since(dr.start))
			dr.v.printf("== run %q done: goodput %.2f of the provisioned rate, %d task deaths\n", dr.run.Name, dr.run.GoodputFrac, dr.run.TasksDied)
			lg.close() // its idle connections are the generator's, not the frontend's
			dr.run.Residue = dr.settle(ctx, baseline)
			var errs []string
			check := dr.run.Ledger.Check
			if dr.lateOK {
				check = dr.run.Ledger.Balance
			}
			if err := check(); err != nil {
				errs = append(errs, err.Error())
			}
			for _, r := range dr.run.Residue {
				if !r.Settled() {
					errs = append(errs, r.String())
				}
			}
			if len(errs) > 0 {
				return dr.run, fmt.Errorf("%w: run %q: %s", errChecks, dr.run.Name, strings.Join(errs, "; "))
			}
			return dr.run, nil
		case <-tick.C:
			el := time.Since(dr.start)
			ph := dr.phase(el)
			if ph != curPhase {
				curPhase = ph
				p := dr.sc.phases[ph]
				dr.run.phaseAt(p.name, dr.phaseStart(ph))
				dr.v.printf("-- %5.1fs  %s\n", el.Seconds(), p.says)
				dr.sc.act(dr, p.name)
			}
			dr.s.poll(dr.run, el)
			dr.v.show(dr.run, dr.sc.phases[ph].name, el, dr.d)
		}
	}
}

// settleWithin bounds the wait, after a run's load, for every task to
// return to its baseline.
const settleWithin = 15 * time.Second

// settle waits until every task's goroutines and live heap are back to
// their baseline (read after the warm-up, before the load), or
// settleWithin passes, and returns the last reading of each task.
func (dr *driver) settle(ctx context.Context, baseline map[string]Stats) []Residue {
	deadline := time.Now().Add(settleWithin)
	for {
		now := dr.s.stats(true)
		var out []Residue
		settled := true
		for _, name := range sortedKeys(baseline) {
			b, a := baseline[name], now[name]
			r := Residue{Task: name, Goroutines: [2]int{b.Goroutines, a.Goroutines}, LiveHeap: [2]uint64{b.LiveHeap, a.LiveHeap}, Read: a.ID != ""}
			settled = settled && r.Settled()
			out = append(out, r)
		}
		if settled || time.Now().After(deadline) || ctx.Err() != nil {
			return out
		}
		select {
		case <-time.After(500 * time.Millisecond): // polling real processes
		case <-ctx.Done():
		}
	}
}

// actDrill starts the action of an overload drill's phase, beside the
// load.
func (dr *driver) actDrill(phase string) {
	s, run := dr.s, dr.run
	switch phase {
	case "restart":
		dr.goAction(func() {
			defer close(dr.restarted)
			s.rollingRestart(dr.runCtx, RoleB, dr.v, run, dr.start)
		})
	case "kill":
		// After the rolling restart, as the script says: a short drill's
		// restart can outlast its phase.
		dr.goAction(func() {
			defer close(dr.killed)
			if !dr.after(dr.restarted) {
				return
			}
			s.stop(s.byName["db-0"], syscall.SIGKILL)
			run.note(fmt.Sprintf("%.1fs db-0 killed (SIGKILL)", time.Since(dr.start).Seconds()))
		})
	case "recovery":
		dr.goAction(func() {
			if !dr.after(dr.killed) {
				return
			}
			if err := s.start(s.byName["db-0"]); err == nil {
				run.note(fmt.Sprintf("%.1fs db-0 started again", time.Since(dr.start).Seconds()))
			}
		})
	}
}

func (dr *driver) goAction(f func()) {
	dr.actions.Add(1)
	go func() {
		defer dr.actions.Done()
		f()
	}()
}

// after waits for ch, and reports false if the run ended first.
func (dr *driver) after(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-dr.runCtx.Done():
		return false
	}
}

// restartDead restarts a dead task 2 s later, as a cluster manager would.
func (dr *driver) restartDead(name string) {
	dr.goAction(func() {
		select {
		case <-time.After(2 * time.Second): // the cluster manager notices and reschedules
		case <-dr.runCtx.Done():
			return
		}
		p := dr.s.byName[name]
		if p == nil || dr.runCtx.Err() != nil || p.alive() {
			return
		}
		if err := dr.s.start(p); err == nil {
			dr.restarts <- name
		}
	})
}

func (s *stack) taskNames() []string {
	var out []string
	for _, p := range s.procs {
		if p.stats != "" {
			out = append(out, p.name)
		}
	}
	return out
}

// rollingRestart restarts a tier's tasks one at a time: SIGTERM (a
// protected task enters lame duck, drains and stops), a new task on the
// same address, ready before the next one goes.
func (s *stack) rollingRestart(ctx context.Context, role string, v *view, run *RunResult, start time.Time) {
	for i := 0; ; i++ {
		p := s.byName[fmt.Sprintf("%s-%d", role, i)]
		if p == nil || ctx.Err() != nil {
			return
		}
		s.stop(p, syscall.SIGTERM)
		run.note(fmt.Sprintf("%.1fs %s stopped (SIGTERM)", time.Since(start).Seconds(), p.name))
		if err := s.start(p); err != nil {
			return
		}
		if err := s.ready(ctx, p); err != nil {
			return
		}
		run.note(fmt.Sprintf("%.1fs %s started again", time.Since(start).Seconds(), p.name))
		select {
		case <-time.After(time.Second): // let it warm up before the next one goes
		case <-ctx.Done():
			return
		}
	}
}

// poll reads every task's stats into the run's current second.
func (s *stack) poll(run *RunResult, el time.Duration) { run.sample(el, s.stats(false)) }

// stats reads every task's stats; with gc, each task collects its garbage
// first, so that its live heap is what it holds.
func (s *stack) stats(gc bool) map[string]Stats {
	var mu sync.Mutex
	var wg sync.WaitGroup
	stats := map[string]Stats{}
	client := &http.Client{Timeout: 500 * time.Millisecond}
	path := "/stats"
	if gc {
		path += "?gc=1"
	}
	for _, p := range s.procs {
		if p.stats == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Get("http://" + p.stats + path)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			var st Stats
			if json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st) == nil {
				mu.Lock()
				stats[p.name] = st
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return stats
}

// MaxHold bounds how long ServeStack keeps the stack up.
const MaxHold = time.Hour

// ServeStack starts the drill's stack (with triage's protections, or without),
// calls ready with the frontend's URL, and keeps the stack up until ctx
// ends or hold passes (at most MaxHold), for a load test pointed at it
// (triage loadtest -url URL/search -header "X-Api-Key: key-gmail"). It
// then stops every process it started. The tasks' logs go to
// o.Out/tasks-stack.log.
func ServeStack(ctx context.Context, o Options, protect bool, hold time.Duration, ready func(url string)) error {
	if o.Command == nil {
		return errors.New("drill: Options.Command is required")
	}
	if hold <= 0 || hold > MaxHold {
		return fmt.Errorf("drill: hold must be between 0 and %v, got %v", MaxHold, hold)
	}
	if o.Out == "" {
		dir, err := os.MkdirTemp("", "triage-stack-")
		if err != nil {
			return err
		}
		o.Out = dir
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(o.Out, "tasks-stack.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	s := &stack{o: o, byName: map[string]*proc{}, deaths: make(chan death, 64), log: logf}
	defer s.stopAll()
	frontAddr, err := s.build(ctx, protect)
	if err != nil {
		return err
	}
	ready("http://" + frontAddr)
	t := time.NewTimer(hold)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return nil
}
