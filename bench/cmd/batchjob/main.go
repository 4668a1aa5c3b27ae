// Command batchjob measures the batch proxy as a fuse (SRE book ch. 21,
// "Load from Connections": "instead of 'batch client → backend,' you have
// 'batch client → batch proxy → backend.' In this case, when the very
// large job starts, only the batch proxy job suffers, shielding the actual
// backends (and higher-priority clients)").
//
// One backend process (GOMAXPROCS=1, pinned to CPU 0, triage's admission
// control and connection bound) serves interactive CRITICAL traffic sent
// open loop from this process (CPU 1) straight to it. After a baseline, a
// batch job of 500 client tasks starts at once in a process of its own (CPU
// 1, nice 19): each task opens its own connection and makes its calls
// (SHEDDABLE_PLUS, the book's default for batch) one after the other, and
// a call that fails is tried again after a jittered exponential backoff,
// as a batch worker re-queues its work, until the job's deadline. The
// tasks' connections carry triage's criticality and attempt counter but
// no client policy: a task that makes ten calls feeds the adaptive
// throttle too few requests for it to be of use, and once refused early
// it holds the task nearly shut for its two-minute window. The job is sent either through `triage
// proxy`'s machinery (a batchproxy.Proxy process with its own admission
// control, GOMAXPROCS=1 on CPU 1, holding one connection to the backend)
// or straight to the backend; the two variants alternate.
//
//	go run ./cmd/batchjob
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/triagehq/triage/triagegrpc/batchproxy"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/bench/internal/burn"
	"github.com/triagehq/triage/bench/internal/child"
	"github.com/triagehq/triage/bench/internal/clientopts"
	"github.com/triagehq/triage/connload"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/measure"
	"github.com/triagehq/triage/signals"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

const peakMethod = "/triage.bench.Conns/Peak"

type config struct {
	tasks     int
	calls     int
	rate      int
	cost      time.Duration
	batchCost time.Duration
	batchCPU  float64
	before    time.Duration
	deadline  time.Duration
	repeats   int
	variants  string
	serverCPU string
	loadCPU   string
	asJSON    bool
}

func main() {
	if subcommand() {
		return
	}
	var c config
	fs := flag.NewFlagSet("batchjob", flag.ContinueOnError)
	fs.IntVar(&c.tasks, "tasks", 500, "batch client tasks started at once (1-5000)")
	fs.IntVar(&c.calls, "calls", 10, "calls each batch task makes")
	fs.IntVar(&c.rate, "rate", 300, "interactive CRITICAL requests per second (open loop)")
	fs.DurationVar(&c.cost, "cost", time.Millisecond, "CPU per interactive request")
	fs.DurationVar(&c.batchCost, "batch-cost", time.Millisecond, "CPU per batch call")
	fs.Float64Var(&c.batchCPU, "batch-cpu", 0, "if > 0, the backend sheds SHEDDABLE_PLUS and SHEDDABLE from this CPU utilization to 0.1 above it (signals.CPU signal; CRITICAL at the default 0.9-1.0)")
	fs.DurationVar(&c.before, "before", 5*time.Second, "interactive traffic before the job (the baseline)")
	fs.DurationVar(&c.deadline, "deadline", 60*time.Second, "the batch job's deadline")
	fs.IntVar(&c.repeats, "repeats", 2, "runs of each variant, interleaved")
	fs.StringVar(&c.variants, "variants", "proxy,direct", "the variants to run, in order: proxy (through the batch proxy), direct")
	fs.StringVar(&c.serverCPU, "server-cpu", "0", "CPU for the backend (taskset), empty for none")
	fs.StringVar(&c.loadCPU, "load-cpu", "1", "CPU for the proxy, the job and this process (taskset), empty for none")
	fs.BoolVar(&c.asJSON, "json", false, "print one JSON object")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if c.tasks < 1 || c.tasks > 5000 || c.calls < 1 || c.calls > 1000 || c.rate < 1 || c.rate > 20000 || c.cost <= 0 || c.batchCost <= 0 || c.batchCPU < 0 || c.batchCPU > 1 ||
		c.before < time.Second || c.deadline < time.Second || c.deadline > 10*time.Minute || c.repeats < 1 || c.repeats > 10 {
		fmt.Fprintln(os.Stderr, "batchjob: need 1 <= tasks <= 5000, 1 <= calls <= 1000, 1 <= rate <= 20000, positive costs, before >= 1s, 1s <= deadline <= 10m, 1 <= repeats <= 10")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, c, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "batchjob:", err)
		os.Exit(1)
	}
}

// subcommand runs the child processes' sub-commands (server, proxy, job)
// and reports whether os.Args named one.
func subcommand() bool {
	if len(os.Args) < 2 {
		return false
	}
	var err error
	switch os.Args[1] {
	case "server":
		err = serverMain(os.Args[2:])
	case "proxy":
		err = proxyMain(os.Args[2:])
	case "job":
		err = jobMain(os.Args[2:])
	default:
		return false
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "batchjob %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	return true
}

// result is one run of one variant.
type result struct {
	Variant string `json:"variant"`
	// The interactive traffic before the job and while it ran.
	BaselineP99MS  float64        `json:"baseline_p99_ms"`
	DuringP99MS    float64        `json:"during_p99_ms"`
	P99Rise        float64        `json:"p99_rise"`
	InteractiveN   int            `json:"interactive_sent"`
	InteractiveOK  float64        `json:"interactive_success"` // share of requests that succeeded, before and during the job
	JobDoneS       float64        `json:"job_done_s"`          // from its start to its last task's last call
	JobCallsDone   int            `json:"job_calls_done"`
	JobCalls       int            `json:"job_calls"`
	JobTries       int            `json:"job_tries"` // tries of the job's calls, counting the tried-again ones
	JobErrors      map[string]int `json:"job_errors,omitempty"`
	BackendPeak    int64          `json:"backend_peak_connections"`
	BackendCPUS    float64        `json:"backend_cpu_s"`
	BackendRejects int64          `json:"backend_rejected"`
}

func run(ctx context.Context, c config, w io.Writer) error {
	child.PinSelf(c.loadCPU)
	rounds, batchRounds := burn.Calibrate(c.cost), burn.Calibrate(c.batchCost)
	var results []result
	for range c.repeats {
		for _, v := range strings.Split(c.variants, ",") {
			if v != "proxy" && v != "direct" {
				return fmt.Errorf("unknown variant %q", v)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r, err := runOne(ctx, c, v, rounds, batchRounds)
			if err != nil {
				return fmt.Errorf("%s: %w", v, err)
			}
			results = append(results, r)
			if !c.asJSON {
				fmt.Fprintf(os.Stderr, "  %-6s interactive p99 %.1f -> %.1f ms, success %.4f; job %d/%d calls in %.1f s\n",
					v, r.BaselineP99MS, r.DuringP99MS, r.InteractiveOK, r.JobCallsDone, r.JobCalls, r.JobDoneS)
				for k, n := range r.JobErrors {
					fmt.Fprintf(os.Stderr, "    %6d × %s\n", n, k)
				}
			}
		}
	}
	if c.asJSON {
		return json.NewEncoder(w).Encode(map[string]any{"tasks": c.tasks, "calls": c.calls, "rate": c.rate,
			"cost_ms": float64(c.cost) / 1e6, "batch_cost_ms": float64(c.batchCost) / 1e6, "results": results})
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "batch job of %d tasks x %d calls (%v each) started at once; interactive %d CRITICAL req/s at %v straight to the backend\n",
		c.tasks, c.calls, c.batchCost, c.rate, c.cost)
	fmt.Fprintln(tw, "job sent\tinteractive p99 before ms\tduring ms\trise\tinteractive success\tjob calls done\tjob time s\ttries per call\tbackend peak conns\tbackend rejected\tbackend CPU s\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.2f\t%.4f\t%d/%d\t%.1f\t%.2f\t%d\t%d\t%.1f\t\n", r.Variant, r.BaselineP99MS, r.DuringP99MS, r.P99Rise,
			r.InteractiveOK, r.JobCallsDone, r.JobCalls, r.JobDoneS, float64(r.JobTries)/float64(max(1, r.JobCallsDone)), r.BackendPeak, r.BackendRejects, r.BackendCPUS)
	}
	return tw.Flush()
}

func runOne(ctx context.Context, c config, variant string, rounds, batchRounds int) (result, error) {
	r := result{Variant: variant, JobCalls: c.tasks * c.calls}
	srv, err := child.Start(c.serverCPU, "server", strconv.Itoa(rounds), strconv.Itoa(batchRounds), strconv.FormatFloat(c.batchCPU, 'f', -1, 64))
	if err != nil {
		return r, err
	}
	defer srv.Stop()
	target := srv.Addr
	if variant == "proxy" {
		px, err := child.Start(c.loadCPU, "proxy", srv.Addr)
		if err != nil {
			return r, err
		}
		defer px.Stop()
		target = px.Addr
	}
	opts := append(clientopts.MustDial(nil), grpc.WithTransportCredentials(insecure.NewCredentials()))
	var conns []*grpc.ClientConn
	for range 4 {
		cc, err := grpc.NewClient("passthrough:///"+srv.Addr, opts...)
		if err != nil {
			return r, err
		}
		defer cc.Close()
		conns = append(conns, cc)
	}
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	for _, cc := range conns {
		if err := cc.Invoke(criticality.NewContext(wctx, criticality.Critical), burn.Method, wrapperspb.String("i"), new(wrapperspb.StringValue)); err != nil {
			wcancel()
			return r, fmt.Errorf("warm-up: %w", err)
		}
	}
	wcancel()
	peak := func() (connload.Stats, int64) {
		out := new(wrapperspb.StringValue)
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var v struct {
			Peak     int64
			Rejected int64
		}
		if err := conns[0].Invoke(pctx, peakMethod, wrapperspb.String(""), out); err == nil {
			json.Unmarshal([]byte(out.Value), &v)
		}
		return connload.Stats{Open: v.Peak}, v.Rejected
	}
	peak() // reset
	cpu0 := srv.CPU()

	// Interactive traffic, open loop, until the job ends (or its deadline).
	start := time.Now()
	jobAt := start.Add(c.before)
	jobDone := make(chan jobReport, 1)
	go func() { jobDone <- runJob(c, target, jobAt) }()
	type sample struct {
		at  time.Duration // scheduled send, from start
		lat time.Duration
		ok  bool
	}
	var mu sync.Mutex
	var samples []sample
	var wg sync.WaitGroup
	var jr jobReport
	var ended atomic.Bool
	for i := 0; ; i++ {
		at := time.Duration(float64(i) / float64(c.rate) * float64(time.Second))
		if ended.Load() || at > c.before+c.deadline+10*time.Second {
			break
		}
		select {
		case jr = <-jobDone:
			ended.Store(true)
			continue
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(time.Until(start.Add(at))):
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(criticality.NewContext(ctx, criticality.Critical), 2*time.Second)
			defer cancel()
			err := conns[i%len(conns)].Invoke(rctx, burn.Method, wrapperspb.String("i"), new(wrapperspb.StringValue))
			mu.Lock()
			samples = append(samples, sample{at, time.Since(start.Add(at)), err == nil})
			mu.Unlock()
		}()
	}
	wg.Wait()
	if !ended.Load() {
		jr = <-jobDone
	}
	r.BackendCPUS = srv.CPU() - cpu0
	st, rej := peak()
	r.BackendPeak, r.BackendRejects = st.Open, rej
	if jr.Err != "" {
		return r, errors.New("job: " + jr.Err)
	}
	r.JobDoneS, r.JobCallsDone, r.JobTries, r.JobErrors = jr.DoneS, jr.Done, jr.Tries, jr.Errors
	jobEnd := c.before + time.Duration(jr.DoneS*float64(time.Second))
	var base, during []time.Duration
	ok := 0
	for _, s := range samples {
		r.InteractiveN++
		if !s.ok {
			continue
		}
		ok++
		switch {
		case s.at < c.before:
			base = append(base, s.lat)
		case s.at <= jobEnd:
			during = append(during, s.lat)
		}
	}
	r.InteractiveOK = float64(ok) / float64(max(1, r.InteractiveN))
	r.BaselineP99MS, r.DuringP99MS = p99(base), p99(during)
	if r.BaselineP99MS > 0 {
		r.P99Rise = r.DuringP99MS / r.BaselineP99MS
	}
	return r, nil
}

// jobReport is what the job process prints.
type jobReport struct {
	DoneS float64 `json:"done_s"`
	Done  int     `json:"done"`
	Tries int     `json:"tries"`
	// Errors counts the failed tries by their error's first 140 bytes.
	Errors map[string]int `json:"errors,omitempty"`
	Err    string         `json:"err,omitempty"`
}

// runJob runs "batchjob job" at the lowest priority on the load CPU.
func runJob(c config, target string, at time.Time) jobReport {
	var r jobReport
	if err := child.RunLow(c.loadCPU, &r, "job", target, strconv.Itoa(c.tasks), strconv.Itoa(c.calls),
		strconv.FormatInt(at.UnixNano(), 10), strconv.FormatInt(int64(c.deadline), 10)); err != nil {
		return jobReport{Err: err.Error()}
	}
	return r
}

// jobMain is the batch job: TASKS tasks start at the wall time AT, each
// with its own connection to TARGET (triage's criticality and attempt
// counter, no client policy: see the command's doc), and make
// CALLS calls one after the other; a failed call is tried again after a
// jittered exponential backoff (50 ms doubling to 2 s), until DEADLINE
// after AT.
func jobMain(args []string) error {
	if len(args) != 5 {
		return errors.New("usage: batchjob job TARGET TASKS CALLS AT-UNIXNANO DEADLINE-NS")
	}
	target := args[0]
	nums, err := child.Counts(args[1:])
	if err != nil {
		return err
	}
	tasks, calls, at, deadline := int(nums[0]), int(nums[1]), time.Unix(0, nums[2]), time.Duration(nums[3])
	if tasks < 1 || tasks > 5000 || calls < 1 || calls > 1000 || deadline > 10*time.Minute {
		return errors.New("need 1 <= TASKS <= 5000, 1 <= CALLS <= 1000, DEADLINE <= 10m")
	}
	time.Sleep(time.Until(at))
	ctx, cancel := context.WithDeadline(criticality.NewContext(context.Background(), criticality.SheddablePlus), at.Add(deadline))
	defer cancel()
	var done, tries atomic.Int64
	var last atomic.Int64 // ns after at of the last call done
	var emu sync.Mutex
	errs := map[string]int{}
	var wg sync.WaitGroup
	for range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cc, err := grpc.NewClient("passthrough:///"+target, append(clientopts.MustDial([]egress.Option{egress.WithoutPolicy()}),
				grpc.WithTransportCredentials(insecure.NewCredentials()))...)
			if err != nil {
				return
			}
			defer cc.Close()
			for range calls {
				backoff := 50 * time.Millisecond
				for {
					tries.Add(1)
					cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
					err := cc.Invoke(cctx, burn.Method, wrapperspb.String("b"), new(wrapperspb.StringValue))
					ccancel()
					if err == nil {
						done.Add(1)
						t := int64(time.Since(at))
						for old := last.Load(); t > old && !last.CompareAndSwap(old, t); old = last.Load() {
						}
						break
					}
					if ctx.Err() != nil {
						return
					}
					emu.Lock()
					if k := err.Error(); len(errs) < 50 || errs[k[:min(140, len(k))]] > 0 {
						errs[k[:min(140, len(k))]]++
					}
					emu.Unlock()
					select {
					case <-ctx.Done():
						return
					case <-time.After(backoff/2 + rand.N(backoff/2+1)):
					}
					backoff = min(2*backoff, 2*time.Second)
				}
			}
		}()
	}
	wg.Wait()
	return json.NewEncoder(os.Stdout).Encode(jobReport{DoneS: float64(last.Load()) / 1e9, Done: int(done.Load()), Tries: int(tries.Load()), Errors: errs})
}

// p99 of latencies, in ms.
func p99(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return float64(measure.QuantileDuration(d, 0.99)) / 1e6
}

// serverMain is the backend: triage's admission control (batch calls,
// SHEDDABLE_PLUS, shed before CRITICAL), connections bounded and counted
// by connload, a health service, the burning method (interactive calls
// burn ROUNDS, batch calls BATCH-ROUNDS, told apart by their body), and a
// method answering the peak of open connections since the last asking and
// the rejections so far.
func serverMain(args []string) error {
	if len(args) != 3 {
		return errors.New("usage: batchjob server ROUNDS BATCH-ROUNDS BATCH-CPU")
	}
	batchCPU, err := strconv.ParseFloat(args[2], 64)
	if err != nil || batchCPU < 0 || batchCPU > 1 {
		return fmt.Errorf("bad batch CPU %q", args[2])
	}
	rounds, err1 := strconv.Atoi(args[0])
	batchRounds, err2 := strconv.Atoi(args[1])
	if err1 != nil || err2 != nil || rounds < 1 || batchRounds < 1 {
		return fmt.Errorf("bad rounds %q %q", args[0], args[1])
	}
	var rejected atomic.Int64
	opts := []admission.Option{admission.WithObserver(rejectCounter{&rejected})}
	if batchCPU > 0 {
		cpu, err := signals.CPU{}.Signal()
		if err != nil {
			return err
		}
		th := admission.DefaultThresholds()
		for _, l := range []criticality.Level{criticality.Sheddable, criticality.SheddablePlus} {
			th.Start[l], th.End[l] = batchCPU, batchCPU+0.1
		}
		opts = append(opts, admission.WithSignal(cpu, th))
	}
	ctl, err := admission.New(opts...)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	cl, err := connload.NewListener(lis)
	if err != nil {
		return err
	}
	ts, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})),
		intake.WithAdmission(ctl)), triagegrpc.WithConnLoad(cl))
	if err != nil {
		return err
	}
	s := grpc.NewServer(ts.ServerOptions()...)
	burn.RegisterFunc(s, func(body string) int {
		if body == "b" {
			return batchRounds
		}
		return rounds
	})
	var peak atomic.Int64
	go func() { // sample the open connections every 10 ms; the process is killed at the end
		for range time.Tick(10 * time.Millisecond) {
			if o := cl.Stats().Open; o > peak.Load() {
				peak.Store(o)
			}
		}
	}()
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: "triage.bench.Conns",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Peak", Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			if err := dec(new(wrapperspb.StringValue)); err != nil {
				return nil, err
			}
			b, _ := json.Marshal(map[string]int64{"Peak": peak.Swap(cl.Stats().Open), "Rejected": rejected.Load()})
			return wrapperspb.String(string(b)), nil
		}}},
	}, struct{}{})
	healthpb.RegisterHealthServer(s, health.NewServer())
	fmt.Printf("LISTEN %s\n", cl.Addr())
	os.Stdout.Sync()
	return s.Serve(cl)
}

type rejectCounter struct{ n *atomic.Int64 }

func (r rejectCounter) Observe(e admission.Event) {
	if e.Kind == admission.Rejected {
		r.n.Add(1)
	}
}

// proxyMain is the batch proxy, as `triage proxy` sets it up:
// batchproxy.Proxy with its own admission control (the batch proxy's
// queue and wait defaults), one connection to the backend.
func proxyMain(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: batchjob proxy BACKEND")
	}
	pol := trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})
	cc, err := grpc.NewClient("passthrough:///"+args[0], append(clientopts.MustDial([]egress.Option{egress.WithoutPolicy()}),
		grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return err
	}
	px, err := batchproxy.New(cc)
	if err != nil {
		return err
	}
	ctl, err := admission.New(admission.WithMaxWait(batchproxy.DefaultMaxWait), admission.WithQueueFactor(batchproxy.DefaultQueueFactor), admission.WithTolerance(batchproxy.DefaultTolerance))
	if err != nil {
		return err
	}
	ts, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(pol), intake.WithAdmission(ctl)))
	if err != nil {
		return err
	}
	s := grpc.NewServer(append(ts.ServerOptions(), px.ServerOptions()...)...)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Printf("LISTEN %s\n", lis.Addr())
	os.Stdout.Sync()
	return s.Serve(lis)
}
