// Command quotascale measures one quota service leader at fleet scale
// (issue 24): the service (quotaservice.Service over a allocate.Allocator,
// what the leader of `triage quota-server -etcd` serves) runs as its own
// process, GOMAXPROCS=1, pinned to one CPU; this process, on the other
// CPU, plays the tasks: each refreshes every -refresh (jittered ±25%, as
// quotaservice.Client does) with a report of its customers. The policy
// names every customer; task i reports -per-task of them, so that each
// customer is seen by tasks × per-task / customers tasks. After a warm-up
// past the Allocator's learning mode (one lease), it reports the Refresh
// latency seen by the tasks (p50, p99, max), the service's CPU per second
// and its resident memory, as medians of -repeats runs.
//
//	cd bench && go run ./cmd/quotascale                       # 1,000 tasks x 10,000 customers
//	cd bench && go run ./cmd/quotascale -per-task 10000       # every task sees every customer
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/triagehq/triage/quota/allocate"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/triagehq/triage/bench/internal/child"
	measuring "github.com/triagehq/triage/internal/measure"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagegrpc/quotaservice"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotapb"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "server" {
		if err := serverMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "quotascale server:", err)
			os.Exit(1)
		}
		return
	}
	fs := flag.NewFlagSet("quotascale", flag.ContinueOnError)
	tasks := fs.Int("tasks", 1000, "tasks refreshing")
	customers := fs.Int("customers", 10000, "customers the policy names")
	perTask := fs.Int("per-task", 1000, "customers each task reports")
	refresh := fs.Duration("refresh", 5*time.Second, "each task's refresh interval (the Allocator's default)")
	lease := fs.Duration("lease", 15*time.Second, "lease length (the warm-up lasts one lease: the Allocator's learning mode)")
	measure := fs.Duration("duration", 30*time.Second, "measured time after the warm-up")
	repeats := fs.Int("repeats", 3, "runs")
	mode := fs.String("mode", "optimistic", "the Allocator's mode: optimistic or pessimistic")
	serverCPU := fs.String("server-cpu", "0", "CPU for the service (taskset); empty for none")
	loadCPU := fs.String("load-cpu", "1", "CPU for the tasks; empty for none")
	asJSON := fs.Bool("json", false, "print the runs as JSON")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	switch {
	case *tasks < 1 || *tasks > 10000:
		fmt.Fprintln(os.Stderr, "quotascale: -tasks must be 1 to 10,000 (the Allocator's default bound)")
		os.Exit(2)
	case *customers < 1 || *customers > quota.MaxCustomers:
		fmt.Fprintf(os.Stderr, "quotascale: -customers must be 1 to %d\n", quota.MaxCustomers)
		os.Exit(2)
	case *perTask < 1 || *perTask > *customers || *perTask > quotapb.MaxEntries-1:
		fmt.Fprintf(os.Stderr, "quotascale: -per-task must be 1 to min(-customers, %d)\n", quotapb.MaxEntries-1)
		os.Exit(2)
	case int64(*tasks)*int64(*perTask) > allocate.DefaultMaxEntries:
		fmt.Fprintf(os.Stderr, "quotascale: tasks x per-task must be at most %d (the Allocator's bound)\n", allocate.DefaultMaxEntries)
		os.Exit(2)
	case *refresh < 100*time.Millisecond || *lease < *refresh || *lease > 10*time.Minute || *measure < time.Second || *measure > 30*time.Minute || *repeats < 1 || *repeats > 10:
		fmt.Fprintln(os.Stderr, "quotascale: need 100ms <= refresh <= lease <= 10m, 1s <= duration <= 30m, 1 <= repeats <= 10")
		os.Exit(2)
	}
	if _, err := quota.ParseMode(*mode); err != nil {
		fmt.Fprintln(os.Stderr, "quotascale:", err)
		os.Exit(2)
	}
	child.PinSelf(*loadCPU)
	cfg := config{tasks: *tasks, customers: *customers, perTask: *perTask, refresh: *refresh, lease: *lease, measure: *measure, mode: *mode, serverCPU: *serverCPU}
	var runs []result
	for i := range *repeats {
		r, err := runOnce(cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, "quotascale:", err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "run %d: %s\n", i+1, r)
		runs = append(runs, r)
	}
	if *asJSON {
		json.NewEncoder(os.Stdout).Encode(runs)
		return
	}
	med := func(f func(result) float64) float64 {
		v := make([]float64, len(runs))
		for i, r := range runs {
			v[i] = f(r)
		}
		return measuring.Median(v)
	}
	fmt.Printf("one leader, %d tasks x %d customers (%d reported per task, %d entries), refresh %v, %s mode; medians of %d runs:\n",
		cfg.tasks, cfg.customers, cfg.perTask, cfg.tasks*cfg.perTask, cfg.refresh, cfg.mode, len(runs))
	fmt.Printf("  refreshes/s %.0f (failed %.0f)\n  Refresh latency p50 %.1f ms, p99 %.1f ms, max %.1f ms\n  service CPU %.3f CPU-seconds per second (%.2f ms per refresh)\n  service memory %.0f MiB resident\n",
		med(func(r result) float64 { return r.PerSecond }), med(func(r result) float64 { return float64(r.Failed) }),
		med(func(r result) float64 { return r.P50ms }), med(func(r result) float64 { return r.P99ms }), med(func(r result) float64 { return r.MaxMs }),
		med(func(r result) float64 { return r.CPU }), med(func(r result) float64 { return 1e3 * r.CPU / r.PerSecond }),
		med(func(r result) float64 { return r.RSSMiB }))
}

type config struct {
	tasks, customers, perTask int
	refresh, lease, measure   time.Duration
	mode, serverCPU           string
}

type result struct {
	PerSecond           float64 `json:"refreshes_per_second"`
	Failed              int     `json:"failed"`
	P50ms, P99ms, MaxMs float64
	CPU                 float64 `json:"cpu_per_second"`
	RSSMiB              float64 `json:"rss_mib"`
	FirstError          string  `json:"first_error,omitempty"`
}

func (r result) String() string {
	s := fmt.Sprintf("%.0f refreshes/s (%d failed), p50 %.1f ms, p99 %.1f ms, max %.1f ms, CPU %.3f/s, RSS %.0f MiB", r.PerSecond, r.Failed, r.P50ms, r.P99ms, r.MaxMs, r.CPU, r.RSSMiB)
	if r.FirstError != "" {
		s += "; first failure: " + r.FirstError
	}
	return s
}

func customerName(i int) string { return "customer-" + strconv.Itoa(i) }

// report is task i's report: per-task customers, starting where its
// index places it, each with a little usage and demand, and the share it
// holds (none before its first lease).
func report(cfg config, i int) *quotapb.RefreshRequest {
	req := &quotapb.RefreshRequest{Task: "task-" + strconv.Itoa(i), Customers: make([]*quotapb.CustomerUsage, cfg.perTask)}
	first := i * cfg.customers / cfg.tasks
	for j := range cfg.perTask {
		c := (first + j) % cfg.customers
		demand := 0.001 * float64(1+(c+i)%7)
		req.Customers[j] = &quotapb.CustomerUsage{Customer: customerName(c), Used: []float64{0, 0, demand, 0}, Demand: demand}
	}
	return req
}

func runOnce(cfg config) (result, error) {
	srv, err := child.Start(cfg.serverCPU, "server", strconv.Itoa(cfg.customers), strconv.Itoa(cfg.tasks), cfg.refresh.String(), cfg.lease.String(), cfg.mode)
	if err != nil {
		return result{}, err
	}
	defer srv.Stop()
	// A few connections, as many tasks' would be spread over a few
	// machines' worth of clients; each call is one task's refresh.
	const conns = 8
	var ccs []quotapb.QuotaClient
	for range conns {
		cc, err := grpc.NewClient(srv.Addr, append(quotaservice.DialOptions(cfg.refresh), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			return result{}, err
		}
		defer cc.Close()
		ccs = append(ccs, quotapb.NewQuotaClient(cc))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	measureFrom := start.Add(cfg.lease + cfg.refresh)
	measureTo := measureFrom.Add(cfg.measure)
	var (
		mu        sync.Mutex
		latencies []time.Duration
		failed    int
		firstErr  string
		cpuFrom   float64
	)
	var wg sync.WaitGroup
	for i := range cfg.tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := report(cfg, i)
			held := map[string]float64{}
			qc := ccs[i%conns]
			// The first refresh after a random part of the interval, as
			// quotaservice.Client's, then every refresh ±25%.
			next := start.Add(time.Duration(rand.Float64() * float64(cfg.refresh)))
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Until(next)):
				}
				if !time.Now().Before(measureTo) {
					return
				}
				for _, c := range req.Customers {
					c.Share = held[c.Customer]
				}
				req.NoLease = len(held) == 0
				cctx, ccancel := context.WithTimeout(ctx, cfg.refresh)
				t0 := time.Now()
				resp, err := qc.Refresh(cctx, req)
				d := time.Since(t0)
				ccancel()
				if err == nil {
					for _, g := range resp.GetGrants() {
						held[g.GetCustomer()] = g.GetShare()
					}
				}
				if ctx.Err() != nil {
					return // the run ended under this call
				}
				if t0.After(measureFrom) {
					mu.Lock()
					if err != nil {
						failed++
						if firstErr == "" {
							firstErr = err.Error()
						}
					} else {
						latencies = append(latencies, d)
					}
					mu.Unlock()
				}
				next = next.Add(time.Duration(float64(cfg.refresh) * (0.75 + 0.5*rand.Float64())))
			}
		}()
	}
	time.Sleep(time.Until(measureFrom))
	cpuFrom = srv.CPU()
	time.Sleep(time.Until(measureTo))
	cpu := srv.CPU() - cpuFrom
	rss := rssMiB(srv.Pid)
	cancel()
	wg.Wait()
	if len(latencies) == 0 {
		return result{}, fmt.Errorf("no refresh succeeded (%d failed)", failed)
	}
	slices.Sort(latencies)
	ms := func(q float64) float64 {
		return float64(measuring.QuantileDuration(latencies, q)) / 1e6
	}
	return result{PerSecond: float64(len(latencies)+failed) / cfg.measure.Seconds(), Failed: failed,
		P50ms: ms(0.5), P99ms: ms(0.99), MaxMs: float64(latencies[len(latencies)-1]) / 1e6,
		CPU: cpu / cfg.measure.Seconds(), RSSMiB: rss, FirstError: firstErr}, nil
}

// rssMiB returns the resident memory of process pid (measure.RSS), in MiB.
func rssMiB(pid int) float64 {
	n, _ := measuring.RSS(pid)
	return float64(n) / (1 << 20)
}

// serverMain serves the quota service for customers customers and tasks
// tasks on a loopback port it announces.
func serverMain(args []string) error {
	if len(args) != 5 {
		return fmt.Errorf("want customers tasks refresh lease mode, got %q", args)
	}
	nums, err := child.Counts(args[:2])
	if err != nil {
		return err
	}
	refresh, err1 := time.ParseDuration(args[2])
	lease, err2 := time.ParseDuration(args[3])
	mode, err3 := quota.ParseMode(args[4])
	if err1 != nil || err2 != nil || err3 != nil {
		return fmt.Errorf("bad arguments %q", args)
	}
	cs := make(map[string]quota.Limit, nums[0])
	for i := range int(nums[0]) {
		cs[customerName(i)] = quota.Limit{CPU: 0.01 * float64(1+i%10)}
	}
	p, err := quota.New(quota.Config{Tasks: int(nums[1]), Customers: cs})
	if err != nil {
		return err
	}
	a, err := allocate.New(p, allocate.WithLease(lease), allocate.WithRefresh(refresh), allocate.WithMode(mode), allocate.WithMaxTasks(int(nums[1])))
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	gs := grpc.NewServer(quotaservice.ServerOptions()...)
	quotapb.RegisterQuotaServer(gs, quotaservice.NewService(a))
	if path := os.Getenv("QUOTASCALE_CPUPROFILE"); path != "" {
		// A CPU profile of the service's first 30 s after the warm-up
		// (for finding where a refresh's CPU goes).
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		go func() {
			time.Sleep(lease + refresh)
			pprof.StartCPUProfile(f)
			time.Sleep(30 * time.Second)
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	fmt.Printf("LISTEN %s\n", lis.Addr())
	return gs.Serve(lis)
}
