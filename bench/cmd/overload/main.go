// Command overload is triage's overload benchmark (issue 4): one backend
// process with one CPU whose handler burns a calibrated amount of CPU, an
// open-loop load generator in this process on the other CPU, and the
// variants side by side in the same run, interleaved. After the open-loop
// steps, the --stock steps drive each variant the way a stock load tool
// does (ghz --rps R -c W): thousands of closed-loop workers that saturate
// the generator's core (cmd/stockclient runs ghz itself).
//
//	go run ./cmd/overload                       # the table
//	go run ./cmd/overload --stock ''            # open-loop steps only
//	go run ./cmd/overload --json                # one JSON object
//	go run ./cmd/overload --cost 5ms --variants triage-admission,oracle-tap16
//	go run ./cmd/overload --rotate 1            # the variants' order turned
//	go run ./cmd/overload --scenario mix        # four criticalities at 5x
//	go run ./cmd/overload --scenario recovery   # 30 s at 10x, then 0.5x
//	go run ./cmd/overload --neighbour           # a CPU-bound neighbour on the backend's core
//	go run ./cmd/overload --gate                # exit 1 if a triage cell is in the bad state
//
// Each load step probes the capacity again first (--reprobe, default on):
// this machine's speed drifts by tens of percent within minutes, so a
// step's goodput is taken against the capacity of the same minute
// (C_step), and against the oracle's goodput in the same step (vs_oracle).
// A row counts its sends more than 10 ms late (late_sends, and their share
// of the sends); it is marked invalid if any was.
//
// It lives in its own module so that the peers it compares against never
// reach triage's users. All traffic stays on 127.0.0.1; every phase is
// bounded in count and time.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/core/stat"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/triagehq/triage/bench/internal/stockrows"
	"github.com/triagehq/triage/criticality"
)

var allVariants = []string{"none", "procrustean", "go-zero", "kratos-bbr", "failsafe-go", "oracle-tap16", "triage-admission", "triage"}

// otherVariants run only when named: triage-no-retry-after is triage whose
// backend never sends a RetryAfter (admission.WithRetryAfter(0, 0)), to
// measure what the sheddable levels' RetryAfter saves; failsafe-go-naive is
// failsafe-go wired through failsafegrpc's helpers (failsafe.go);
// oracle-tap2 and oracle-tap4 are the oracle with fewer requests in
// flight, to see what its goodput owes to its queue.
var otherVariants = []string{"triage-no-retry-after", "failsafe-go-naive", "oracle-tap2", "oracle-tap4"}

type config struct {
	rounds    int // work per request, calibrated once by run
	cost      time.Duration
	loads     []float64
	variants  []string
	step      time.Duration
	warmup    time.Duration
	deadline  time.Duration
	conns     int
	generator string // "raw" (rawgrpc) or "grpc" (grpc-go's client), for the open-loop steps of variants without triage's client
	json      bool
	scenario  string
	serverCPU string
	loadCPU   string
	stock     []stockrows.Row // steps driven the way a stock load tool drives a server (workersLoop)
	reprobe   bool
	rotate    int // variants run in their order turned left by rotate
	// neighbour runs a CPU-bound process on the backend's core for the
	// whole run (a noisy neighbour on a shared node): the backend gets
	// about half of its core, the capacity probes included.
	neighbour bool
	// gate makes the run fail when a triage cell is in the bad state:
	// goodput below gateGoodput of its capacity or p99 above gateP99.
	gate        bool
	gateGoodput float64
	gateP99     time.Duration
}

func main() {
	// go-zero logs CPU statistics from a goroutine it starts at init; keep
	// the benchmark's output clean.
	logx.Disable()
	stat.DisableLog()
	if len(os.Args) > 1 && os.Args[1] == "server" {
		serverCommand(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "neighbour" {
		neighbourCommand()
		return
	}
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "overload:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "overload:", err)
		os.Exit(1)
	}
}

// errGate is run's error when --gate found a cell in the bad state.
var errGate = errors.New("--gate: a triage cell is in the bad state")

// gateFailures lists the cells of the triage variants whose goodput is
// below min of their capacity or whose p99 is above p99 (issue 54's bad
// state), each as one line.
func gateFailures(rs []result, min float64, p99 time.Duration) []string {
	var out []string
	for _, r := range rs {
		if r.Variant != "triage-admission" && r.Variant != "triage" {
			continue
		}
		if r.Goodput < min || r.P99ms > ms(p99) {
			cell := fmt.Sprintf("%gx", r.Load)
			if r.Workers > 0 {
				cell = fmt.Sprintf("%gx/%dw", r.Load, r.Workers)
			}
			out = append(out, fmt.Sprintf("%s %s: goodput %.2f (want >= %.2f), p99 %.0f ms (want <= %.0f), late sends %d, generator at %.0f%% of its core", r.Variant, cell, r.Goodput, min, r.P99ms, ms(p99), r.LateSends, 100*r.GeneratorCPU))
		}
	}
	return out
}

// serverCommand runs the backend process the driver starts ("overload
// server --variant V --rounds N"); it exits on error.
func serverCommand(args []string) {
	fs := flag.NewFlagSet("server", flag.ExitOnError)
	variant := fs.String("variant", "none", "")
	rounds := fs.Int("rounds", 0, "")
	fs.Parse(args)
	if err := serverMain(*variant, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("overload", flag.ContinueOnError)
	var c config
	var loads, variants, stock string
	fs.DurationVar(&c.cost, "cost", time.Millisecond, "CPU each request burns in the handler")
	fs.StringVar(&loads, "loads", "0.8,1,2,5,10", "offered loads, as multiples of the probed capacity")
	fs.StringVar(&variants, "variants", strings.Join(allVariants, ","), "variants to run")
	fs.DurationVar(&c.step, "step", 10*time.Second, "length of each load step (figures over its second half)")
	fs.DurationVar(&c.warmup, "warmup", 3*time.Second, "warm-up at 0.5x before each step")
	fs.DurationVar(&c.deadline, "deadline", time.Second, "deadline of each request")
	fs.IntVar(&c.conns, "conns", 4, "client connections")
	fs.StringVar(&c.generator, "generator", "raw", "open-loop generator of the variants without triage's client: raw (HTTP/2 frames, rawgrpc: margin at 20x on one core) or grpc (grpc-go's client, a goroutine per call)")
	fs.BoolVar(&c.json, "json", false, "print one JSON object instead of the table")
	fs.BoolVar(&c.reprobe, "reprobe", true, "probe the capacity again before every load step and take that step's goodput against it (this machine's speed drifts by tens of percent within minutes)")
	fs.StringVar(&c.scenario, "scenario", "steps", "steps, mix (four criticalities at 5x) or recovery (30 s at 10x, then 0.5x)")
	fs.StringVar(&c.serverCPU, "server-cpu", "0", "CPU to pin the backend to (taskset), empty for none")
	fs.StringVar(&c.loadCPU, "load-cpu", "1", "CPU to pin the load generator to (taskset), empty for none")
	fs.StringVar(&stock, "stock", "5x3000,10x600,10x3000", "steps driven as a stock load tool does (ghz --rps LOADxC -c WORKERS): closed-loop workers on the generator's one core, which they saturate; empty for none")
	fs.BoolVar(&c.neighbour, "neighbour", false, "run a CPU-bound neighbour process on the backend's core (--server-cpu) for the whole run, as on a shared node")
	fs.BoolVar(&c.gate, "gate", false, "exit 1 if any cell of triage-admission or triage has goodput below --gate-goodput of its capacity or p99 above --gate-p99, whether or not the generator kept its schedule (latency is taken from the schedule, so lateness can only fail a cell)")
	fs.Float64Var(&c.gateGoodput, "gate-goodput", 0.85, "the least goodput, as a share of the step's capacity, --gate accepts")
	fs.DurationVar(&c.gateP99, "gate-p99", 100*time.Millisecond, "the largest p99 --gate accepts")
	fs.IntVar(&c.rotate, "rotate", 0, "run the variants in their order turned left this many places, so that interleaved runs (--rotate 0, 1, 2, ...) give each variant each place in a step's sequence")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	for _, f := range strings.Split(loads, ",") {
		x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(x > 0 && x <= 100) {
			return c, fmt.Errorf("--loads: %q is not a multiple in (0, 100]", f)
		}
		c.loads = append(c.loads, x)
	}
	var err error
	if c.stock, err = stockrows.Parse(stock); err != nil {
		return c, fmt.Errorf("--stock: %v", err)
	}
	known := map[string]bool{}
	for _, v := range append(allVariants, otherVariants...) {
		known[v] = true
	}
	for _, v := range strings.Split(variants, ",") {
		v = strings.TrimSpace(v)
		if !known[v] {
			return c, fmt.Errorf("--variants: unknown %q (have %s)", v, strings.Join(append(allVariants, otherVariants...), ", "))
		}
		c.variants = append(c.variants, v)
	}
	if c.rotate < 0 {
		return c, fmt.Errorf("--rotate must be at least 0, got %d", c.rotate)
	}
	k := c.rotate % len(c.variants)
	c.variants = append(c.variants[k:], c.variants[:k]...)
	switch {
	case c.cost < 10*time.Microsecond || c.cost > time.Second:
		return c, fmt.Errorf("--cost must be in [10µs, 1s], got %v", c.cost)
	case c.step < 2*time.Second || c.step > 10*time.Minute:
		return c, fmt.Errorf("--step must be in [2s, 10m], got %v", c.step)
	case c.warmup < 0 || c.warmup > time.Minute:
		return c, fmt.Errorf("--warmup must be in [0, 1m], got %v", c.warmup)
	case c.deadline < 10*time.Millisecond || c.deadline > time.Minute:
		return c, fmt.Errorf("--deadline must be in [10ms, 1m], got %v", c.deadline)
	case c.generator != "raw" && c.generator != "grpc":
		return c, fmt.Errorf("--generator must be raw or grpc, got %q", c.generator)
	case c.conns < 1 || c.conns > 64:
		return c, fmt.Errorf("--conns must be in [1, 64], got %d", c.conns)
	case c.neighbour && c.serverCPU == "":
		return c, fmt.Errorf("--neighbour needs --server-cpu: the neighbour shares the backend's core")
	case !(c.gateGoodput >= 0 && c.gateGoodput <= 2) || c.gateP99 <= 0:
		return c, fmt.Errorf("--gate-goodput must be in [0, 2] and --gate-p99 positive, got %v and %v", c.gateGoodput, c.gateP99)
	case c.scenario != "steps" && c.scenario != "mix" && c.scenario != "recovery":
		return c, fmt.Errorf("--scenario must be steps, mix or recovery, got %q", c.scenario)
	}
	return c, nil
}

// probe measures the capacity C of the unprotected backend: closed loop,
// 32 callers, 5 s after 1 s of warm-up.
func probe(ctx context.Context, cfg config) (float64, error) {
	b, err := startBackend(cfg, "none")
	if err != nil {
		return 0, err
	}
	defer b.stop()
	ccs, _, closeAll, err := dial(cfg, b, "none")
	if err != nil {
		return 0, err
	}
	defer closeAll()
	measure := func(d time.Duration) int64 {
		var n int64
		var done = make(chan int64)
		end := time.Now().Add(d)
		for w := 0; w < 32; w++ {
			go func(w int) {
				var k int64
				for time.Now().Before(end) && ctx.Err() == nil {
					cctx, cancel := context.WithTimeout(ctx, cfg.deadline)
					if ccs[w%len(ccs)].Invoke(cctx, method, wrapperspb.String("x"), new(wrapperspb.StringValue)) == nil {
						k++
					}
					cancel()
				}
				done <- k
			}(w)
		}
		for w := 0; w < 32; w++ {
			n += <-done
		}
		return n
	}
	measure(time.Second)
	n := measure(5 * time.Second)
	if n == 0 {
		return 0, fmt.Errorf("capacity probe: no request succeeded")
	}
	return float64(n) / 5, nil
}

// result is one (variant, load) cell.
type result struct {
	Variant       string             `json:"variant"`
	Load          float64            `json:"load"`
	Workers       int                `json:"workers,omitempty"` // closed-loop callers (--stock); 0: open loop
	Goodput       float64            `json:"goodput"`
	P50ms         float64            `json:"p50_ms"`
	P99ms         float64            `json:"p99_ms"`
	PeakRSSMB     float64            `json:"peak_rss_mb"`
	Survived      bool               `json:"survived"`
	ByCriticality map[string]float64 `json:"by_criticality,omitempty"`
	Codes         map[string]int     `json:"codes"`
	Valid         bool               `json:"valid"`
	Sent          int64              `json:"sent"`
	Completed     int64              `json:"completed"`
	MaxOverMS     float64            `json:"max_over_deadline_ms"`
	MaxLagMS      float64            `json:"max_send_lag_ms"`
	LateSends     int64              `json:"sends_over_10ms_late"`
	Untriaged     int                `json:"failures_without_overload_outcome"`
	Goroutines    [2]int             `json:"goroutines_before_after"`
	// Retries is, per criticality, the retries triage's client sent
	// during the step (the triage variants only); RetriesLate those of
	// its second half, over which the other figures are taken.
	Retries     map[string]int64 `json:"retries,omitempty"`
	RetriesLate map[string]int64 `json:"retries_second_half,omitempty"`
	// StepCapacityRPS is the capacity probed just before this load step
	// (--reprobe), against which Goodput is taken; VsOracle is Goodput
	// over the oracle's in the same step (when the oracle ran in it).
	StepCapacityRPS float64 `json:"step_capacity_rps,omitempty"`
	// GeneratorCPU is the share of its one core the load generator (this
	// process) used over the step: near 1, its own lateness and stalls
	// are its own (issue 54: at 20x it collapsed against the oracle too).
	GeneratorCPU float64 `json:"generator_cpu"`
	// Generator is the open-loop generator of the step: raw or grpc.
	Generator string  `json:"generator,omitempty"`
	VsOracle  float64 `json:"vs_oracle,omitempty"`
}

// againstOracle sets each result's goodput over the oracle's, the results
// of one load step.
func againstOracle(rs []result) {
	for _, o := range rs {
		if o.Variant == "oracle-tap16" && o.Goodput > 0 {
			for i := range rs {
				rs[i].VsOracle = rs[i].Goodput / o.Goodput
			}
		}
	}
}

type report struct {
	CapacityRPS float64  `json:"capacity_rps"`
	CostMS      float64  `json:"cost_ms"`
	Scenario    string   `json:"scenario"`
	Results     []result `json:"results"`
	Recovery    any      `json:"recovery,omitempty"`
}

func run(ctx context.Context, cfg config, w io.Writer) error {
	if cfg.loadCPU != "" {
		if ts, err := exec.LookPath("taskset"); err == nil {
			if exec.Command(ts, "-a", "-pc", cfg.loadCPU, strconv.Itoa(os.Getpid())).Run() == nil {
				// One core: one P, so that Go's scheduler, not the
				// kernel's time slices, interleaves the generator's work.
				runtime.GOMAXPROCS(1)
			}
		}
	}
	cfg.rounds = calibrate(cfg.cost)
	if cfg.neighbour {
		stop, err := startNeighbour(cfg.serverCPU)
		if err != nil {
			return err
		}
		defer stop()
	}
	fmt.Fprintf(os.Stderr, "overload: %d sha256 rounds per request (cost %v); probing capacity (GOMAXPROCS=1 backend, %d CPUs here)\n", cfg.rounds, cfg.cost, runtime.NumCPU())
	c, err := probe(ctx, cfg)
	if err != nil {
		return err
	}
	rep := report{CapacityRPS: c, CostMS: float64(cfg.cost) / 1e6, Scenario: cfg.scenario}
	switch cfg.scenario {
	case "steps":
		for _, load := range cfg.loads {
			cs := c
			if cfg.reprobe {
				if cs, err = probe(ctx, cfg); err != nil {
					return err
				}
				fmt.Fprintf(os.Stderr, "  capacity re-probed before %.1fx: %.0f req/s (%.2f of the first probe)\n", load, cs, cs/c)
			}
			first := len(rep.Results)
			for _, v := range cfg.variants {
				r, err := step(ctx, cfg, cs, v, load, 0, []share{{criticality.Critical, 1}})
				if err != nil {
					return err
				}
				r.StepCapacityRPS = cs
				fmt.Fprintf(os.Stderr, "  %-17s %5.1fx goodput %.2f p99 %.0f ms\n", v, load, r.Goodput, r.P99ms)
				rep.Results = append(rep.Results, r)
			}
			againstOracle(rep.Results[first:])
		}
		for _, row := range cfg.stock {
			for _, v := range cfg.variants {
				r, err := step(ctx, cfg, c, v, row.Load, row.Workers, []share{{criticality.Critical, 1}})
				if err != nil {
					return err
				}
				fmt.Fprintf(os.Stderr, "  %-17s %5.1fx, %d workers: goodput %.2f p99 %.0f ms\n", v, row.Load, row.Workers, r.Goodput, r.P99ms)
				rep.Results = append(rep.Results, r)
			}
		}
	case "mix":
		mix := []share{{criticality.CriticalPlus, 0.06}, {criticality.Critical, 0.06}, {criticality.SheddablePlus, 0.44}, {criticality.Sheddable, 0.44}}
		for _, v := range cfg.variants {
			r, err := step(ctx, cfg, c, v, 5, 0, mix)
			if err != nil {
				return err
			}
			rep.Results = append(rep.Results, r)
		}
	case "recovery":
		for _, v := range cfg.variants {
			rec, err := recovery(ctx, cfg, c, v)
			if err != nil {
				return err
			}
			rep.Recovery = rec
		}
	}
	if cfg.json {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printTable(w, rep)
	}
	if cfg.gate {
		if bad := gateFailures(rep.Results, cfg.gateGoodput, cfg.gateP99); len(bad) > 0 {
			for _, b := range bad {
				fmt.Fprintln(os.Stderr, "gate:", b)
			}
			return errGate
		}
	}
	return nil
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// startNeighbour starts a CPU-bound process pinned to cpu ("overload
// neighbour"), and returns what stops it.
func startNeighbour(cpu string) (func(), error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	ts, err := exec.LookPath("taskset")
	if err != nil {
		return nil, fmt.Errorf("--neighbour needs taskset: %v", err)
	}
	cmd := exec.Command(ts, "-c", cpu, exe, "neighbour")
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return func() { cmd.Process.Kill(); cmd.Wait() }, nil
}

// neighbourCommand burns CPU for at most an hour ("overload neighbour").
func neighbourCommand() {
	end := time.Now().Add(time.Hour)
	var sum [32]byte
	for time.Now().Before(end) {
		for i := 0; i < 1000; i++ {
			sum = sha256.Sum256(sum[:])
		}
	}
	sink.Add(uint64(sum[0]))
}

// step runs one (variant, load) cell on a fresh backend: open loop, or
// workers closed-loop callers if workers > 0.
func step(ctx context.Context, cfg config, c float64, variant string, load float64, workers int, mix []share) (result, error) {
	r := result{Variant: variant, Load: load, Workers: workers}
	b, err := startBackend(cfg, variant)
	if err != nil {
		return r, err
	}
	defer b.stop()
	ccs, count, closeAll, err := dial(cfg, b, variant)
	if err != nil {
		return r, err
	}
	defer closeAll()
	// Variants without triage's client get the cheap generator (raw) for
	// their open-loop steps: the same schedule, and margin on its core.
	open := func(rate float64, d time.Duration, seed uint64) (*phase, error) {
		return openLoop(ctx, ccs, rate, d, cfg.deadline, mix, seed), nil
	}
	r.Generator = "grpc"
	if cfg.generator == "raw" && count == nil {
		r.Generator = "raw"
		open = func(rate float64, d time.Duration, seed uint64) (*phase, error) {
			return openLoopRaw(ctx, b.Addr, cfg.conns, rate, d, cfg.deadline, mix, seed)
		}
	}
	if workers > 0 {
		r.Generator = "" // closed loop: grpc-go's client, as a stock tool
	}
	if cfg.warmup > 0 {
		if _, err := open(0.5*c, cfg.warmup, 1); err != nil {
			return r, err
		}
	}
	var retriedBefore [criticality.NumLevels]int64
	half := make(chan [criticality.NumLevels]int64, 1)
	if count != nil {
		retriedBefore = count.snapshot()
		go func() {
			time.Sleep(cfg.step / 2)
			half <- count.snapshot()
		}()
	}
	before, _ := b.stats()
	var mid stats
	go func() {
		time.Sleep(cfg.step * 3 / 4)
		mid, _ = b.stats()
	}()
	var p *phase
	cpu0, wall0 := processCPU(), time.Now()
	if err := profileGenerator(variant, load, cfg.step); err != nil {
		return r, err
	}
	if workers > 0 {
		p = workersLoop(ctx, ccs, load*c, cfg.step, cfg.deadline, workers, mix, 2)
	} else if p, err = open(load*c, cfg.step, 2); err != nil {
		return r, err
	}
	r.GeneratorCPU = float64(processCPU()-cpu0) / float64(time.Since(wall0))
	if mid.Limit > 0 {
		fmt.Fprintf(os.Stderr, "    during the step: limit %d executing %d queued %d pending %d/%.2f service %.1f ms\n", mid.Limit, mid.Executing, mid.Queued, mid.Pending, mid.PendingCap, mid.ServiceMS)
	}
	if count != nil {
		r.Retries, r.RetriesLate = map[string]int64{}, map[string]int64{}
		retriedHalf := <-half
		for l, n := range count.snapshot() {
			if len(mix) > 1 || n > 0 {
				r.Retries[criticality.Level(l).String()] = n - retriedBefore[l]
				r.RetriesLate[criticality.Level(l).String()] = n - retriedHalf[l]
			}
		}
	}
	s := summarize(p, cfg.step/2, cfg.step)
	time.Sleep(2 * time.Second) // let the backend settle before reading its goroutines
	after, err := b.stats()
	if len(after.Rejected) > 0 {
		fmt.Fprintf(os.Stderr, "    rejections by criticality/reason: %v\n", after.Rejected)
	}
	r.Survived = err == nil && b.Running()
	r.Goodput = s.goodputRPS / c
	r.P50ms, r.P99ms = ms(s.p50), ms(s.p99)
	r.PeakRSSMB = after.RSSMB
	r.Goroutines = [2]int{before.Goroutines, after.Goroutines}
	r.Sent, r.Completed = p.sent, p.done
	r.Valid = p.lagOver == 0
	r.MaxLagMS, r.LateSends = ms(p.maxLag), p.lagOver
	r.MaxOverMS = ms(s.maxOver)
	r.Untriaged = s.untriagedFailed
	r.Codes = map[string]int{}
	for code, n := range s.codes {
		r.Codes[code.String()] = n
	}
	if len(mix) > 1 {
		r.ByCriticality = map[string]float64{}
		for l, b := range s.byLevel {
			if b[1] > 0 {
				r.ByCriticality[l.String()] = float64(b[0]) / float64(b[1])
			}
		}
	}
	return r, nil
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// profileGenerator profiles this process, the generator, for the next d
// into TRIAGE_BENCH_CPUPROFILE's directory, if it is set.
func profileGenerator(variant string, load float64, d time.Duration) error {
	dir := os.Getenv("TRIAGE_BENCH_CPUPROFILE")
	if dir == "" {
		return nil
	}
	return profileFor(filepath.Join(dir, fmt.Sprintf("generator-%s-%gx.prof", variant, load)), d)
}
