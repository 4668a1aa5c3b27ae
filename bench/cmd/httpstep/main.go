// Command httpstep measures the README's net/http server (issue 54, item
// 4): admission.New and triagehttp.Middleware exactly as the README shows,
// a handler burning -work of CPU, on one CPU (taskset -c 0, GOMAXPROCS=1).
// The load is `triage loadtest -url` (built from this module's triage) on
// the other CPU: -loads (default 1,10), so that the 10x step starts from a
// server that served 1x, and its per-second timeline shows how long the
// step takes to settle.
//
//	cd bench && go run ./cmd/httpstep -repeats 5
//	cd bench && go run ./cmd/httpstep server -protect=false   # the server alone
//
// Each repeat starts a fresh server and probes its capacity again; every
// run's figures are printed, and -json writes them.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/bench/internal/burn"
	"github.com/triagehq/triage/bench/internal/child"
	"github.com/triagehq/triage/bench/internal/statetrace"
	"github.com/triagehq/triage/bench/internal/triagebin"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/trust"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "server" {
		if err := serve(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "httpstep server:", err)
			os.Exit(1)
		}
		return
	}
	if err := drive(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "httpstep:", err)
		os.Exit(1)
	}
}

// serve is the README's server: a handler burning rounds sha256 rounds.
func serve(args []string) error {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	protect := fs.Bool("protect", true, "put triage's middleware in front of the handler")
	rounds := fs.Int("rounds", 0, "sha256 rounds a request burns (0: calibrate to -work)")
	work := fs.Duration("work", 4*time.Millisecond, "CPU a request burns, when -rounds is 0")
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on (loopback)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *rounds == 0 {
		*rounds = burn.Calibrate(*work)
	}
	n := *rounds
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, burn.Rounds(n))
	})
	if *protect {
		rejected := &reasons{}
		ctl, err := admission.New(admission.WithObserver(rejected))
		if err != nil {
			return err
		}
		pol, err := trust.New(trust.Config{Networks: []string{"127.0.0.1/32"}})
		if err != nil {
			return err
		}
		mw, err := triagehttp.Middleware(triagehttp.WithAdmission(ctl), triagehttp.WithIntake(intake.WithTrust(pol)))
		if err != nil {
			return err
		}
		h = mw(h)
		if name := os.Getenv("TRIAGE_BENCH_TRACE"); name != "" {
			if err := traceState(name, ctl, rejected); err != nil {
				return err
			}
		}
	}
	if name := os.Getenv("TRIAGE_BENCH_CPUPROFILE"); name != "" { // experiment: the process's first 40 s
		f, err := os.Create(name)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		time.AfterFunc(14*time.Second, func() { pprof.StopCPUProfile(); f.Close() })
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	fmt.Printf("LISTEN %s\n", lis.Addr())
	return (&http.Server{Handler: h, ConnContext: triagehttp.ConnContext, ReadHeaderTimeout: 10 * time.Second}).Serve(lis)
}

// reasons counts the controller's rejections by reason.
type reasons struct {
	n        [admission.NumReasons]atomic.Int64
	admitted atomic.Int64
}

func (r *reasons) Observe(e admission.Event) {
	switch e.Kind {
	case admission.Rejected:
		r.n[e.Reason].Add(1)
	case admission.Admitted:
		r.admitted.Add(1)
	}
}

// traceState appends the controller's state to name every 100 ms, one
// JSON line each, until the process ends (TRIAGE_BENCH_TRACE=FILE), with
// the interval's run-queue waits (p50, p99, max), the goroutines
// runnable, the interval's admissions and rejections by reason, and the
// process's CPU time in the interval.
func traceState(name string, ctl *admission.Controller, counts *reasons) error {
	ms := []metrics.Sample{{Name: "/sched/latencies:seconds"}, {Name: "/sched/goroutines/runnable:goroutines"}}
	var last []uint64
	var lastCPU time.Duration
	return statetrace.Start(name, 100*time.Millisecond, func() map[string]any {
		rej := map[string]int64{}
		for why := range admission.NumReasons {
			rej[why.String()] = counts.n[why].Swap(0)
		}
		cpu := processCPU()
		used := cpu - lastCPU
		lastCPU = cpu
		metrics.Read(ms)
		h := ms[0].Value.Float64Histogram()
		q := waits(h, last)
		last = append(last[:0], h.Counts...)
		st := ctl.Stats()
		return map[string]any{
			"limit": st.Limit, "pending": st.Pending, "cap": st.PendingCap,
			"exec": st.Executing, "queued": st.Queued, "svc_ms": float64(st.ServiceTime) / 1e6,
			"delay_ms": float64(st.QueueDelay) / 1e6, "busy": st.Busy, "est_ms": float64(st.RunQueueWait) / 1e6,
			"shed": st.QueueShed, "goroutines": runtime.NumGoroutine(), "runnable": ms[1].Value.Uint64(),
			"rq_p50_ms": q[0] * 1e3, "rq_p99_ms": q[1] * 1e3, "rq_max_ms": q[2] * 1e3,
			"admitted": counts.admitted.Swap(0), "rejected": rej, "cpu_ms": float64(used) / 1e6,
		}
	})
}

// processCPU returns the CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// waits returns the p50, p99 and max, in seconds (upper bucket edges), of
// the run-queue waits h counted since last (nil: none yet).
func waits(h *metrics.Float64Histogram, last []uint64) (q [3]float64) {
	if last == nil {
		return q
	}
	var n uint64
	d := make([]uint64, len(h.Counts))
	for i := range h.Counts {
		d[i] = h.Counts[i] - last[i]
		n += d[i]
	}
	var c uint64
	for i, v := range d {
		c += v
		if v > 0 {
			q[2] = h.Buckets[i+1]
		}
		if q[0] == 0 && c*2 >= n && n > 0 {
			q[0] = h.Buckets[i+1]
		}
		if q[1] == 0 && c*100 >= 99*n && n > 0 {
			q[1] = h.Buckets[i+1]
		}
	}
	return q
}

// A second is good when its successes reach goodSecond of C with a p99
// within goodP99 ms: a step has settled from the first second after which
// every one is.
const (
	goodSecond = 0.85
	goodP99    = 100
)

type run struct {
	Protect  bool            `json:"protect"`
	Repeat   int             `json:"repeat"`
	Result   json.RawMessage `json:"result"`
	Capacity float64         `json:"capacity_rps"`
}

func drive(args []string) error {
	fs := flag.NewFlagSet("httpstep", flag.ContinueOnError)
	repeats := fs.Int("repeats", 3, "fresh servers per variant")
	loads := fs.String("loads", "1,10", "loadtest's -loads")
	step := fs.Duration("step", 10*time.Second, "loadtest's -step")
	work := fs.Duration("work", 4*time.Millisecond, "CPU a request burns")
	variants := fs.String("variants", "triage", "triage, unprotected, or both comma-separated")
	jsonOut := fs.String("json", "", "write every run's result here")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *repeats < 1 || *repeats > 50 {
		return fmt.Errorf("-repeats must be in [1, 50], got %d", *repeats)
	}
	dir, err := os.MkdirTemp("", "httpstep")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	triage, err := triagebin.Build(dir)
	if err != nil {
		return err
	}
	rounds := burn.Calibrate(*work)
	var runs []run
	for i := range *repeats {
		for _, v := range strings.Split(*variants, ",") {
			if v != "triage" && v != "unprotected" {
				return fmt.Errorf("unknown variant %q", v)
			}
			r, err := once(triage, dir, v == "triage", rounds, *loads, *step)
			if err != nil {
				return err
			}
			r.Repeat = i
			runs = append(runs, r)
		}
	}
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(runs, "", "  ")
		return os.WriteFile(*jsonOut, b, 0o644)
	}
	return nil
}

func once(triage, dir string, protect bool, rounds int, loads string, step time.Duration) (run, error) {
	p, err := child.Start("0", "server", fmt.Sprintf("-protect=%v", protect), fmt.Sprintf("-rounds=%d", rounds))
	if err != nil {
		return run{}, err
	}
	defer p.Stop()
	out := filepath.Join(dir, "out")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "taskset", "-c", "1", triage, "loadtest", "-url", "http://"+p.Addr+"/",
		"-loads", loads, "-step", step.String(), "-out", out)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return run{}, fmt.Errorf("loadtest: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(out, "result.json"))
	if err != nil {
		return run{}, err
	}
	var res struct {
		Capacity float64 `json:"capacity_rps"`
		Steps    []struct {
			Load     float64                    `json:"load"`
			Goodput  float64                    `json:"goodput"`
			Latency  struct{ P50, P99 float64 } `json:"latency_ms"`
			Timeline []struct {
				At      float64                    `json:"at_s"`
				OK      [4]float64                 `json:"ok_per_second"`
				Latency struct{ P50, P99 float64 } `json:"latency_ms"`
			} `json:"timeline"`
		} `json:"steps"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return run{}, err
	}
	if len(res.Steps) == 0 {
		return run{}, errors.New("loadtest wrote no steps")
	}
	for _, s := range res.Steps {
		var secs []string
		settled, after, worst := 0, 0.0, 0.0 // the first second from which every one is good; goodput and worst p99 after the first
		for i, t := range s.Timeline {
			sum := 0.0
			for _, v := range t.OK {
				sum += v
			}
			g := sum / res.Capacity
			if g < goodSecond || t.Latency.P99 > goodP99 {
				settled = i + 1
			}
			if i > 0 {
				after += g / float64(len(s.Timeline)-1)
				worst = max(worst, t.Latency.P99)
			}
			secs = append(secs, fmt.Sprintf("%.2f/%.0f", g, t.Latency.P99))
		}
		fmt.Printf("RESULT protect=%v C=%.0f load=%gx goodput=%.2f p50=%.0fms p99=%.0fms settled-at=%ds after-first-second: goodput=%.2f worst-p99=%.0fms per-second goodput/p99=[%s]\n",
			protect, res.Capacity, s.Load, s.Goodput, s.Latency.P50, s.Latency.P99, settled, after, worst, strings.Join(secs, " "))
	}
	return run{Protect: protect, Result: b, Capacity: res.Capacity}, nil
}
