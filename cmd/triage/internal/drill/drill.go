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
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
