// Command storm measures a connection storm (SRE book ch. 21, "Load from
// Connections"): one backend process (GOMAXPROCS=1, pinned to one core)
// serves steady CRITICAL traffic from a load generator pinned to the other
// core; then a thousand new clients connect within one second, each making
// one health check and then staying idle. The same run is made with the
// backend's listener bounded by connload (the default accept rate) and
// unbounded, interleaved; the table compares the steady traffic's
// failures and p99 before and during the storm.
//
//	go run ./cmd/storm             # 1000 clients within 1 s, steady 50% of one core
//	go run ./cmd/storm --json
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

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
	"github.com/triagehq/triage/loadtest"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

const method = burn.Method

type config struct {
	clients   int
	within    time.Duration
	rate      int
	cost      time.Duration
	before    time.Duration
	after     time.Duration
	repeats   int
	accept    float64
	serverCPU string
	loadCPU   string
	asJSON    bool
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "server" {
		if err := serverMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "storm server:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "clients" {
		if err := clientsMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "storm clients:", err)
			os.Exit(1)
		}
		return
	}
	var c config
	fs := flag.NewFlagSet("storm", flag.ContinueOnError)
	fs.IntVar(&c.clients, "clients", 1000, "new clients in the storm (1-5000)")
	fs.DurationVar(&c.within, "within", time.Second, "the storm's length")
	fs.IntVar(&c.rate, "rate", 500, "steady CRITICAL requests per second (open loop)")
	fs.DurationVar(&c.cost, "cost", time.Millisecond, "CPU per steady request")
	fs.DurationVar(&c.before, "before", 5*time.Second, "steady traffic before the storm (the baseline)")
	fs.DurationVar(&c.after, "after", 5*time.Second, "steady traffic measured from the storm's start")
	fs.IntVar(&c.repeats, "repeats", 2, "runs of each variant, interleaved")
	fs.Float64Var(&c.accept, "accept-rate", connload.DefaultAcceptRate, "the bounded backend's new connections per second (burst 50)")
	fs.StringVar(&c.serverCPU, "server-cpu", "0", "CPU to pin the backend to (taskset), empty for none")
	fs.StringVar(&c.loadCPU, "load-cpu", "1", "CPU to pin this load generator to (taskset), empty for none")
	fs.BoolVar(&c.asJSON, "json", false, "print one JSON object")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if c.clients < 1 || c.clients > 5000 || c.within <= 0 || c.rate < 1 || c.rate > 20000 || c.cost <= 0 ||
		c.before < time.Second || c.after < c.within || c.repeats < 1 || c.repeats > 10 {
		fmt.Fprintln(os.Stderr, "storm: need 1 <= clients <= 5000, positive within and cost, 1 <= rate <= 20000, before >= 1s, after >= within, 1 <= repeats <= 10")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, c, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "storm:", err)
		os.Exit(1)
	}
}

// result is one run of one variant.
type result struct {
	Variant string `json:"variant"`
	// The steady traffic before the storm and from its start.
	BaselineP99MS float64 `json:"baseline_p99_ms"`
	StormP99MS    float64 `json:"storm_p99_ms"`
	P99Rise       float64 `json:"p99_rise"` // storm / baseline
	SteadySent    int     `json:"steady_sent"`
	SteadyFailed  int     `json:"steady_failed"`
	// The storm's clients: how long their first health check took, and
	// how many failed (deadline 10 s).
	StormClients   int     `json:"storm_clients"`
	StormFailed    int     `json:"storm_failed"`
	StormFirstP50S float64 `json:"storm_first_p50_s"`
	StormFirstMaxS float64 `json:"storm_first_max_s"`
	// ServerCPUS is the CPU the backend process used from the steady
	// traffic's start to the end.
	ServerCPUS float64 `json:"server_cpu_s"`
}

func run(ctx context.Context, c config, w io.Writer) error {
	child.PinSelf(c.loadCPU)
	rounds := burn.Calibrate(c.cost)
	var results []result
	for i := 0; i < c.repeats; i++ {
		for _, v := range []string{"bounded", "unbounded"} {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r, err := runOne(ctx, c, v, rounds)
			if err != nil {
				return fmt.Errorf("%s: %w", v, err)
			}
			results = append(results, r)
			if !c.asJSON {
				fmt.Fprintf(os.Stderr, "  %-9s p99 %.1f -> %.1f ms, steady failed %d of %d, storm clients failed %d\n",
					v, r.BaselineP99MS, r.StormP99MS, r.SteadyFailed, r.SteadySent, r.StormFailed)
			}
		}
	}
	if c.asJSON {
		return json.NewEncoder(w).Encode(map[string]any{"clients": c.clients, "within_s": c.within.Seconds(), "rate": c.rate, "cost_ms": float64(c.cost) / 1e6, "results": results})
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%d clients within %v, steady %d CRITICAL req/s at %v each; bound %v new connections/s\n", c.clients, c.within, c.rate, c.cost, c.accept)
	fmt.Fprintln(tw, "variant\tbaseline p99 ms\tstorm p99 ms\trise\tsteady failed\tstorm clients failed\tfirst check p50 s\tfirst check max s\tserver CPU s\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.2f\t%d/%d\t%d/%d\t%.2f\t%.2f\t%.2f\t\n", r.Variant, r.BaselineP99MS, r.StormP99MS, r.P99Rise,
			r.SteadyFailed, r.SteadySent, r.StormFailed, r.StormClients, r.StormFirstP50S, r.StormFirstMaxS, r.ServerCPUS)
	}
	return tw.Flush()
}

func runOne(ctx context.Context, c config, variant string, rounds int) (result, error) {
	srv, err := child.Start(c.serverCPU, "server", variant, strconv.Itoa(rounds), strconv.FormatFloat(c.accept, 'f', -1, 64))
	if err != nil {
		return result{}, err
	}
	defer srv.Stop()
	addr := srv.Addr
	r := result{Variant: variant, StormClients: c.clients}
	opts := append(clientopts.MustDial([]egress.Option{egress.WithoutPolicy()}), grpc.WithTransportCredentials(insecure.NewCredentials()))
	var steady []*grpc.ClientConn
	for range 4 {
		cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
		if err != nil {
			return r, err
		}
		defer cc.Close()
		steady = append(steady, cc)
	}
	// Warm up the steady connections.
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	for _, cc := range steady {
		if err := cc.Invoke(criticality.NewContext(wctx, criticality.Critical), method, wrapperspb.String("w"), new(wrapperspb.StringValue)); err != nil {
			wcancel()
			return r, fmt.Errorf("warm-up: %w", err)
		}
	}
	wcancel()

	cpu0 := srv.CPU()
	total := c.before + c.after
	n := int(float64(c.rate) * total.Seconds())
	lat := make([]time.Duration, n)
	fails := make([]bool, n)
	start := time.Now()
	// The storm, from c.before on, in a process of its own at the lowest
	// priority on the load generator's CPU, so that setting up a thousand
	// clients does not delay this process's steady sends: the steady p99
	// then speaks of the backend.
	stormDone := make(chan stormReport, 1)
	go func() { stormDone <- runStormProcess(c, addr, start.Add(c.before), total-c.before) }()
	loadtest.OpenLoop{}.Run(ctx, loadtest.Every(float64(c.rate), total), func(i int, lag time.Duration) func() {
		sched := time.Now().Add(-lag)
		return func() {
			rctx, cancel := context.WithTimeout(criticality.NewContext(ctx, criticality.Critical), time.Second)
			defer cancel()
			err := steady[i%len(steady)].Invoke(rctx, method, wrapperspb.String("x"), new(wrapperspb.StringValue))
			lat[i], fails[i] = time.Since(sched), err != nil // from the scheduled send time
		}
	})
	sr := <-stormDone
	r.ServerCPUS = srv.CPU() - cpu0
	split := int(float64(c.rate) * c.before.Seconds())
	var base, during []time.Duration
	for i := range n {
		if fails[i] {
			r.SteadyFailed++
			continue
		}
		if i < split {
			base = append(base, lat[i])
		} else {
			during = append(during, lat[i])
		}
	}
	r.SteadySent = n
	r.BaselineP99MS, r.StormP99MS = p99(base), p99(during)
	if r.BaselineP99MS > 0 {
		r.P99Rise = r.StormP99MS / r.BaselineP99MS
	}
	if sr.Err != "" {
		return r, fmt.Errorf("storm clients: %s", sr.Err)
	}
	r.StormFailed = sr.Failed
	if len(sr.FirstNS) > 0 {
		firsts := make([]float64, len(sr.FirstNS))
		for i, ns := range sr.FirstNS {
			firsts[i] = float64(ns) / 1e9
		}
		slices.Sort(firsts)
		r.StormFirstP50S, r.StormFirstMaxS = measure.Quantile(firsts, 0.5), firsts[len(firsts)-1]
	}
	return r, nil
}

// stormReport is what the storm process prints: each successful client's
// time to its first health check, and the failures.
type stormReport struct {
	FirstNS []int64 `json:"first_ns"`
	Failed  int     `json:"failed"`
	Err     string  `json:"err,omitempty"`
}

// runStormProcess runs "storm clients" at the lowest priority on the load
// generator's CPU and returns its report.
func runStormProcess(c config, addr string, at time.Time, hold time.Duration) stormReport {
	var r stormReport
	if err := child.RunLow(c.loadCPU, &r, "clients", addr, strconv.Itoa(c.clients), strconv.FormatInt(int64(c.within), 10),
		strconv.FormatInt(at.UnixNano(), 10), strconv.FormatInt(int64(hold), 10)); err != nil {
		return stormReport{Err: err.Error()}
	}
	return r
}

// clientsMain is the storm process: n clients dial addr evenly over
// within from the wall time at, each checks health (deadline 10 s) and
// stays connected for hold; it prints a stormReport.
func clientsMain(args []string) error {
	if len(args) != 5 {
		return errors.New("usage: storm clients ADDR N WITHIN-NS AT-UNIXNANO HOLD-NS")
	}
	addr := args[0]
	nums, err := child.Counts(args[1:])
	if err != nil {
		return err
	}
	n, within, at, hold := int(nums[0]), time.Duration(nums[1]), time.Unix(0, nums[2]), time.Duration(nums[3])
	if n < 1 || n > 5000 || hold > time.Hour {
		return errors.New("need 1 <= N <= 5000 and HOLD <= 1h")
	}
	firsts := make([]int64, n)
	errs := make([]error, n)
	ccs := make([]*grpc.ClientConn, n)
	var wg sync.WaitGroup
	for i := range n {
		if d := time.Until(at.Add(time.Duration(float64(i) / float64(n) * float64(within)))); d > 0 {
			time.Sleep(d)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				errs[i] = err
				return
			}
			ccs[i] = cc
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, errs[i] = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
			firsts[i] = int64(time.Since(t0))
		}()
	}
	wg.Wait()
	if d := time.Until(at.Add(hold)); d > 0 {
		time.Sleep(d)
	}
	var r stormReport
	for i := range n {
		if ccs[i] != nil {
			ccs[i].Close()
		}
		if errs[i] != nil {
			r.Failed++
		} else {
			r.FirstNS = append(r.FirstNS, firsts[i])
		}
	}
	return json.NewEncoder(os.Stdout).Encode(r)
}

// p99 of latencies measured from each request's scheduled send time, in ms.
func p99(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return float64(measure.QuantileDuration(d, 0.99)) / 1e6
}

// serverMain is the backend: admission control, a health service, and a
// method burning rounds of sha256; "bounded" serves through a
// connload.Listener with its defaults (bare connections, counted from
// gRPC's events: triagegrpc.WithConnLoad).
func serverMain(args []string) error {
	if len(args) != 3 {
		return errors.New("usage: storm server bounded|unbounded ROUNDS ACCEPT-RATE")
	}
	rate, err := strconv.ParseFloat(args[2], 64)
	if err != nil {
		return fmt.Errorf("bad accept rate %q", args[2])
	}
	rounds, err := strconv.Atoi(args[1])
	if err != nil || rounds < 1 {
		return fmt.Errorf("bad rounds %q", args[1])
	}
	ctl, err := admission.New()
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	sopts := []triagegrpc.ServerOption{triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})), intake.WithAdmission(ctl))}
	if args[0] == "bounded" {
		cl, err := connload.NewListener(lis, connload.WithAcceptRate(rate, connload.DefaultAcceptBurst))
		if err != nil {
			return err
		}
		lis, sopts = cl, append(sopts, triagegrpc.WithConnLoad(cl))
	}
	ts, err := triagegrpc.NewServer(sopts...)
	if err != nil {
		return err
	}
	s := grpc.NewServer(ts.ServerOptions()...)
	burn.Register(s, rounds)
	healthpb.RegisterHealthServer(s, health.NewServer())
	fmt.Printf("LISTEN %s\n", lis.Addr())
	os.Stdout.Sync()
	return s.Serve(lis)
}
