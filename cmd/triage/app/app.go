// Package app is the triage command as a library: cmd/triage runs it, and
// a build that adds to it (triageotel/cmd/triage, with OpenTelemetry)
// runs it with its Options. It only parses flags, handles signals and
// wires packages together.
//
//	triage demo [flags]              the overload drill on real processes (internal/drill)
//	triage loadtest [flags]          overload your own service (package loadtest)
//	triage quota-server [flags]      the global quota service (triagegrpc/quotaservice)
//	triage proxy [flags]             the batch proxy (batchproxy.Proxy)
//	triage sidecar [flags]           triage in front of a service in any language (package sidecar)
//	triage extproc [flags]           triage's decision for Envoy (package triageextproc)
//	triage sim SCENARIO [flags]      the book's experiments on virtual time (package sim)
//	triage version                   the build's version
//	triage help COMMAND              a command's flags
//	triage serve ROLE [flags]        one task of the drill's stack (internal: the drill starts it)
//
// Its API is the command's, not a library's: it may change in any
// release.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/triagehq/triage/cmd/triage/internal/drill"
	"github.com/triagehq/triage/triagegrpc/lb"
)

const helpText = `triage keeps RPC services standing under overload (SRE book ch. 20-21).

Usage:
  triage demo [flags]    the overload drill: a stack of real processes on loopback
                         hit by 10x its provisioned rate, restarted and killed,
                         with triage and without; live view, summary, report.html
                         (-faults: crash, hang, slow, partition, ... one at a time)

  triage loadtest -grpc ADDR -method /pkg.Svc/M | -url URL [flags]
                         overload your own service: find its capacity, offer
                         0.5x to 10x with a criticality mix, and see whether it
                         keeps its provisioned rate (table, result.json, page)

  triage quota-server -policy FILE [-listen ADDR] [flags]
                         the quota service: tasks report per-customer CPU usage
                         and lease their share of each customer's limit
  triage quota-server -etcd ENDPOINTS -advertise ADDR [-policy-key KEY] [flags]
                         one of its replicas, the leader elected through etcd

  triage proxy -backends ADDR,... [-listen ADDR] [flags]
                         the batch proxy: batch clients call it instead of the
                         backends; it forwards any method, with its own admission
                         control, over few connections (the book's fuse)

  triage sidecar -upstream URL [-listen ADDR] [-egress ADDR=URL] [flags]
                         triage for a service not written in Go: a reverse proxy
                         in front of it (HTTP/1.1, HTTP/2, gRPC) with the edge,
                         criticality and admission, and egress listeners for its
                         own calls with the client side (throttle, retry budget)

  triage extproc [-listen ADDR] [flags]
                         Envoy's external processor (ext_proc filter): each
                         request's criticality and admission, answered as
                         continue (with triage's headers) or 503/429

  triage sim subsetting [flags]
                         connections per backend under deterministic, random or
                         ringsteady subsetting (Figures 20-3 to 20-5), and churn
  triage sim lb|throttle|retry|stack|shed|cascade|throttling|quota-tree [flags]
                         the book's balancing, throttling, retry, shedding and
                         quota experiments on virtual time, next to the book's
                         numbers (-out DIR: figures and a self-contained page)

  triage version         the version, its commit and its Go
  triage help COMMAND    a command's flags (help sim SCENARIO: a scenario's)
`

// Main runs the command as a process, args without the program's name:
// SIGINT and SIGTERM end its context (a clean shutdown: lame duck, drain,
// stop). It returns the exit code. `triage sidecar` first runs itself
// again with the GODEBUG setting of its -quiet-sysmon flag (sysmonEnv),
// the same process.
func Main(args []string, opts ...Option) int {
	if env, ok := sysmonEnv(args, os.Environ()); ok {
		if err := reexec(args, env); err != nil {
			fmt.Fprintf(os.Stderr, "triage: running on with Go's default sysmon (-quiet-sysmon): %v\n", err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Run(ctx, args, os.Stdout, os.Stderr, opts...)
}

// Run runs the command until it ends or ctx is done (a serving command's
// clean shutdown), writing to stdout and stderr. It returns the exit code.
// Its first call in a process registers triage's gRPC balancer (package
// lb) in grpc-go's process-wide registry, which must not change while a
// ClientConn runs: call Main or Run before dialing anything else.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, opts ...Option) int {
	return runWith(ctx, args, stdout, stderr, opts...)
}

// registerBalancer registers triage's gRPC balancer, once per process
// (lb.Register): the drill's tasks and the batch proxy dial through it,
// the proxy with its metrics given per ClientConn (lb.WithTracker).
func registerBalancer() { balancerOnce.Do(func() { lb.Register() }) }

var balancerOnce sync.Once

// runProcess is Main without options: the test binary as the command.
func runProcess(args []string) int { return Main(args) }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runWith(ctx, args, stdout, stderr)
}

// runWith is the command, with the build's options.
func runWith(ctx context.Context, args []string, stdout, stderr io.Writer, opts ...Option) int {
	registerBalancer()
	o := &options{}
	for _, opt := range opts {
		opt(o)
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, helpText)
		return 2
	}
	switch args[0] {
	case "demo":
		return runDemo(ctx, args[1:], stdout, stderr)
	case "serve":
		return runServe(ctx, args[1:], stderr)
	case "sim":
		return runSim(args[1:], stdout, stderr)
	case "quota-server":
		return runQuotaServer(ctx, args[1:], stdout, stderr, o)
	case "proxy":
		return runProxy(ctx, args[1:], stdout, stderr, o)
	case "sidecar":
		return runSidecar(ctx, args[1:], stdout, stderr, o)
	case "extproc":
		return runExtproc(ctx, args[1:], stdout, stderr, o)
	case "loadtest":
		return runLoadtest(ctx, args[1:], stdout, stderr)
	case "version", "-version", "--version":
		return runVersion(args[1:], stdout, stderr, o)
	case "help":
		return runHelp(ctx, args[1:], stdout, stderr, o)
	case "-h", "-help", "--help":
		fmt.Fprint(stdout, helpText)
		return 0
	}
	fmt.Fprintf(stderr, "triage: unknown command %q\n\n%s", args[0], helpText)
	return 2
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var f demoFlags
	fs := flag.NewFlagSet("triage demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, demoUsage)
		fs.PrintDefaults()
	}
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "triage demo: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	opts, err := f.options()
	if err != nil {
		fmt.Fprintf(stderr, "triage demo: %v\n", err)
		return 2
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "triage demo: %v\n", err)
		return 1
	}
	opts.Stdout = stdout
	opts.Command = func(args ...string) *exec.Cmd { return exec.Command(self, args...) } // the environment is inherited
	if f.stack != "" {
		err = drill.ServeStack(ctx, opts, f.stack == "with", f.hold, func(url string) {
			fmt.Fprintf(stdout, "the drill's stack (%s triage) is up: frontend %s (paths /checkout, /search, /suggest, /prefetch; header X-Api-Key: key-gmail, key-calendar, key-android)\nit stops in %v or on Ctrl-C\n", f.stack, url, f.hold)
		})
	} else {
		_, err = drill.Run(ctx, opts)
	}
	switch {
	case err != nil && ctx.Err() != nil:
		fmt.Fprintln(stderr, "triage demo: interrupted; every process it started is stopped")
		return 130
	case err != nil:
		fmt.Fprintf(stderr, "triage demo: %v\n", err)
		return 1
	}
	return 0
}

const demoUsage = `Usage: triage demo [flags]

The overload drill: a stack of real processes on loopback (an HTTP frontend,
gRPC backends A and B, the DB frontend, three tasks per gRPC tier on machines
of two speeds, and the quota service) provisioned for 100 requests a second,
hit by 10x that, then a rolling restart of tier B, then a SIGKILL of a DB
task, then recovery; twice, with triage's protections and without them.
It shows a live view, prints a summary, and writes result.json and a
self-contained report.html with the plots.

With -faults, the same stack (at the provisioned rate, or 2x where the
fault says) meets faults instead, each injected mid-load and removed:
crash (SIGKILL of a task of each tier in turn), hang (SIGSTOP), slow (10x
slower handlers), partition (the DB tier cut off; needs root),
partition-one (the DB tier cut off from one task of tier B; needs root),
quota (the quota service down), restart (rolling restart of every tier) and storm (the
whole DB tier stopped for 5 s). Every request's outcome is checked.

Flags:
`

// demoFlags are triage demo's flags.
type demoFlags struct {
	duration, hold          time.Duration
	out, serve, only, stack string
	faults                  string
	quiet, lateOK, shadow   bool
	rounds                  int
}

func (f *demoFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&f.duration, "duration", 2*time.Minute, "length of the whole drill, both runs (20s-1h)")
	fs.StringVar(&f.out, "out", "", "directory for result.json, report.html and the tasks' logs (default: a new temporary directory, printed at the end)")
	fs.StringVar(&f.serve, "serve", "", "also serve the live view as a web page on this address, e.g. 127.0.0.1:8080")
	fs.BoolVar(&f.quiet, "quiet", false, "print one line a second instead of redrawing the live view")
	fs.BoolVar(&f.lateOK, "late-ok", false, "record answers later than the user's timeout without failing the run (on a machine busy with other work they measure the machine); the ledger must still balance")
	fs.BoolVar(&f.shadow, "shadow", false, "also run the stack with every refusing mechanism in shadow on the same load, and compare what shadow would have refused with what triage refused")
	fs.StringVar(&f.only, "only", "", "run only one side: \"with\" or \"without\" triage (default: both)")
	fs.IntVar(&f.rounds, "rounds", 1, fmt.Sprintf("repeat the drill this many times (1-%d; each round lasts -duration) and report medians", drill.MaxRounds))
	fs.StringVar(&f.stack, "stack", "", "start only the stack, \"with\" or \"without\" triage, print the frontend's URL and keep it up for -hold (for triage loadtest)")
	fs.DurationVar(&f.hold, "hold", 10*time.Minute, "with -stack: how long to keep the stack up (at most 1h; Ctrl-C stops it sooner)")
	fs.StringVar(&f.faults, "faults", "", "run the fault harness instead of the overload drill: all, or a comma-separated list of "+strings.Join(drill.Faults(), ", ")+
		" (each fault a run with triage and one without, its length set by the fault: -duration is not used)")
}

// options checks the flags and returns the drill's options, without its
// output and command.
func (f *demoFlags) options() (drill.Options, error) {
	o := drill.Options{Duration: f.duration, Out: f.out, Serve: f.serve, Quiet: f.quiet, LateOK: f.lateOK, Rounds: f.rounds, Shadow: f.shadow}
	switch {
	case f.duration < 20*time.Second || f.duration > time.Hour:
		return o, fmt.Errorf("-duration must be between 20s and 1h, got %v", f.duration)
	case f.rounds < 1 || f.rounds > drill.MaxRounds:
		return o, fmt.Errorf("-rounds must be between 1 and %d, got %d", drill.MaxRounds, f.rounds)
	case f.stack != "" && f.stack != "with" && f.stack != "without":
		return o, fmt.Errorf("-stack must be \"with\" or \"without\", got %q", f.stack)
	}
	if f.faults != "" {
		o.Faults = strings.Split(f.faults, ",")
		for _, name := range o.Faults {
			if name != "all" && !slices.Contains(drill.Faults(), name) {
				return o, fmt.Errorf("unknown fault %q in -faults (want all, or some of %s)", name, strings.Join(drill.Faults(), ", "))
			}
		}
	}
	switch f.only {
	case "":
	case "with":
		o.Runs = []bool{true}
	case "without":
		o.Runs = []bool{false}
	default:
		return o, fmt.Errorf("-only must be \"with\" or \"without\", got %q", f.only)
	}
	return o, nil
}

// runServe is `triage serve ROLE [flags]`: one task of the drill's stack,
// until SIGTERM (a clean shutdown, in lame duck first when protected) or
// it runs out of memory (exit status drill.ExitOOM).
func runServe(ctx context.Context, args []string, stderr io.Writer) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintln(stderr, "usage: triage serve frontend|a|b|db -stats ADDR [flags]")
		return 2
	}
	t := drill.Task{Role: args[0]}
	fs := flag.NewFlagSet("triage serve "+t.Role, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&t.ID, "id", t.Role, "the task's name")
	fs.IntVar(&t.Index, "index", 0, "the task's index in its tier (its subsetting client id)")
	fs.StringVar(&t.Listen, "listen", "127.0.0.1:0", "serving address")
	fs.StringVar(&t.Stats, "stats", "", "address of the /stats endpoint (required)")
	next := fs.String("next", "", "comma-separated addresses of the next tier")
	fs.IntVar(&t.Slots, "slots", 4, "worker slots, the machine's speed (1-64)")
	fs.DurationVar(&t.Work, "work", 10*time.Millisecond, "time a request holds a slot (0-1s)")
	fs.BoolVar(&t.Protect, "protect", true, "triage's protections on (false: plain gRPC, naive retries)")
	fs.BoolVar(&t.Shadow, "shadow", false, "with -protect: every refusing mechanism in shadow (decides, counts, refuses nothing)")
	fs.StringVar(&t.Quota, "quota", "", "quota service address, or the comma-separated addresses of its replicas (DB tasks)")
	fs.Int64Var(&t.MemLimit, "mem-limit", 128<<20, "request memory the task may hold, bytes")
	fs.IntVar(&t.MaxConns, "max-conns", drill.DefaultFrontendConns, "open connections the protected frontend accepts (more wait in the accept queue; 0: no bound)")
	fs.Func("force-shed", "game-day drill: reject a fraction of one criticality for a time, LEVEL:FRACTION:DURATION (e.g. SHEDDABLE_PLUS:0.5:10m; repeatable; also POST /fault?shed=... on the stats address)", func(v string) error {
		d, err := drill.ParseForceShed(v)
		if err == nil {
			t.ForceShed = append(t.ForceShed, d)
		}
		return err
	})
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *next != "" {
		t.Next = strings.Split(*next, ",")
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "triage serve: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if err := t.Validate(); err != nil {
		fmt.Fprintf(stderr, "triage serve: %v\n", err)
		return 2
	}
	switch err := drill.Serve(ctx, t, stderr); {
	case errors.Is(err, drill.ErrOutOfMemory):
		return drill.ExitOOM
	case err != nil:
		fmt.Fprintf(stderr, "triage serve %s: %v\n", t.ID, err)
		return 1
	}
	return 0
}
