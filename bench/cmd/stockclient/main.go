// Command stockclient measures triage against a client nobody here wrote
// (issue 20): ghz, the stock gRPC load tool, saturating its own CPU with
// thousands of workers, and a slow sender that opens streams and sends
// their messages late. The backend is grpc.testing.TestService, its
// EmptyCall burning about 1 ms of CPU, protected exactly as the README
// shows, on one CPU (taskset -c 0, GOMAXPROCS=1); ghz and the attacker run
// on the other, the attacker by default in a process of its own at nice 19
// ("stockclient attack"), as if from another machine.
//
//	go install github.com/bojand/ghz/cmd/ghz@v0.121.0
//	cd bench && go run ./cmd/stockclient                  # capacity C, then ~5x and ~10x C with 600 and 3,000 workers
//	cd bench && go run ./cmd/stockclient -scenario slow   # CRITICAL at 0.8 C, alone and beside 1,000 slow senders
//	cd bench && go run ./cmd/stockclient -scenario readers   # CRITICAL at 0.8 C, alone and beside 200 streams their client does not read
//	cd bench && go run ./cmd/stockclient server -protect=false -listen 127.0.0.1:50051   # the backend alone, for ghz by hand
//
// Every figure is the median of -repeats runs, each on a fresh backend
// process; all traffic stays on 127.0.0.1 and every run is bounded in time.
// The table gives each row twice: over ghz's whole run, and over its
// middle, from 2 s after ghz starts to 1 s before its -z ends, where the
// load is steady (ghz's start and the last second, in which its final
// calls wait out their timeout, are not). -max-streams sets the protected
// backend's grpc.MaxConcurrentStreams, to try pushing back with HTTP/2
// instead of refusing; the backend's -trace writes an execution trace.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/triagehq/triage/bench/internal/burn"
	"github.com/triagehq/triage/bench/internal/child"
	"github.com/triagehq/triage/bench/internal/stockrows"
	"github.com/triagehq/triage/internal/measure"
)

const emptyCall = "grpc.testing.TestService/EmptyCall"

type config struct {
	ghz      string
	scenario string
	repeats  int
	duration time.Duration
	cost     time.Duration
	rounds   int
	capacity float64
	// perOK and perRefusal are the server's CPU-seconds per OK call and
	// per refusal, as measured.
	perOK, perRefusal float64
	// okOverhead is perOK less the handler's own burn per call, in the
	// capacity runs: what an OK call costs beside its handler.
	okOverhead float64
	stats      bool
	rows       string
	attacker   string
	maxStreams uint // the protected backend's streams per connection; 0: triagegrpc's default
}

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "server" || os.Args[1] == "attack") {
		cmd := serverCommand
		if os.Args[1] == "attack" {
			cmd = attackCommand
		}
		if err := cmd(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "stockclient %s: %v\n", os.Args[1], err)
			os.Exit(1)
		}
		return
	}
	fs := flag.NewFlagSet("stockclient", flag.ExitOnError)
	var c config
	fs.StringVar(&c.ghz, "ghz", "ghz", "the ghz binary (go install github.com/bojand/ghz/cmd/ghz@v0.121.0)")
	fs.StringVar(&c.scenario, "scenario", "table", "table (ghz at ~5x and ~10x C), slow (slow senders beside steady CRITICAL traffic) or readers (slow readers beside it)")
	fs.IntVar(&c.repeats, "repeats", 3, "runs per row; figures are medians")
	fs.DurationVar(&c.duration, "z", 10*time.Second, "length of each ghz run")
	fs.DurationVar(&c.cost, "cost", time.Millisecond, "CPU each call burns")
	fs.Float64Var(&c.capacity, "capacity", 0, "capacity C in OK calls/s; 0 measures it (to compare two builds at the same offered rates, give both the same C)")
	fs.StringVar(&c.rows, "rows", "5x3000,10x600,10x3000", "the table's rows, LOADxWORKERS: offered load in multiples of C and ghz workers")
	fs.StringVar(&c.attacker, "attacker", "low", "where the slow senders run: low (a process of their own on ghz's CPU at nice 19, as if on another machine) or inproc (goroutines of this process, at ghz's priority)")
	fs.UintVar(&c.maxStreams, "max-streams", 0, "the protected backend's bound on one connection's open streams (grpc.MaxConcurrentStreams; ghz opens 8 connections); 0 keeps triagegrpc's default")
	fs.BoolVar(&c.stats, "stats", false, "the backends print the controller's state every 250 ms, and each run its status codes, to stderr")
	fs.Parse(os.Args[1:])
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "stockclient:", err)
		os.Exit(1)
	}
}

func run(c config) error {
	switch {
	case c.repeats < 1 || c.repeats > 20:
		return fmt.Errorf("-repeats must be in [1, 20], got %d", c.repeats)
	case c.duration < 2*time.Second || c.duration > 5*time.Minute:
		return fmt.Errorf("-z must be in [2s, 5m], got %v", c.duration)
	case c.scenario != "table" && c.scenario != "slow" && c.scenario != "readers":
		return fmt.Errorf("-scenario must be table, slow or readers, got %q", c.scenario)
	case c.attacker != "low" && c.attacker != "inproc":
		return fmt.Errorf("-attacker must be low or inproc, got %q", c.attacker)
	}
	ghz, err := exec.LookPath(c.ghz)
	if err != nil {
		return fmt.Errorf("%v: install it with go install github.com/bojand/ghz/cmd/ghz@v0.121.0", err)
	}
	c.ghz = ghz
	// This process (the slow sender) shares CPU 1 with ghz; the backend has
	// CPU 0.
	child.PinSelf("1")
	runtime.GOMAXPROCS(1)
	c.rounds = burn.Calibrate(c.cost)
	capacity := c.capacity
	if capacity <= 0 || c.scenario == "table" {
		measured, perOK, overhead, err := measureCapacity(c)
		if err != nil {
			return err
		}
		fmt.Printf("capacity: %.0f OK calls/s, %.1f µs of server CPU each (ghz closed loop, 50 workers, unprotected backend, cost %v, median of %d)\n", measured, perOK*1e6, c.cost, c.repeats)
		if capacity <= 0 {
			capacity = measured
		}
		c.perOK, c.okOverhead = perOK, overhead
	}
	fmt.Printf("capacity C = %.0f OK calls/s\n\n", capacity)
	if c.scenario != "table" {
		return attackScenario(c, capacity)
	}
	if err := measureRefusal(&c, capacity); err != nil {
		return err
	}
	rows, err := stockrows.Parse(c.rows)
	if err != nil {
		return fmt.Errorf("-rows: %v", err)
	}
	return table(c, capacity, rows)
}

// table runs ghz for each row c.repeats times against fresh protected
// backends and prints two tables of medians: over ghz's whole run, and
// over its middle (window), where the load is steady.
func table(c config, capacity float64, rows []stockrows.Row) error {
	fmt.Println("Over ghz's whole run. ALLOWS: the OK calls/s one CPU allows after the refusals' own cost, (1 s - REFUSED/s x refusal) / OK call;")
	fmt.Println("TIMEOUT/s: of REFUSED/s, the calls ghz timed out (1 s); P99: ghz's, over all its calls.")
	fmt.Printf("%-8s %8s %8s %8s %6s %10s %9s %8s %7s %7s %11s %8s  %s\n", "LOAD", "RATE", "WORKERS", "OK/s", "OK/C", "REFUSED/s", "TIMEOUT/s", "P99", "ALLOWS", "OK/ALL", "SERVER_CPU", "GHZ_CPU", "runs (OK/s @ server CPU)")
	var mids []string
	for _, row := range rows {
		rate := int(row.Load * capacity)
		var rs runs
		for i := 0; i < c.repeats; i++ {
			r, err := ghzRun(c, true, "--rps", strconv.Itoa(rate), "-c", strconv.Itoa(row.Workers))
			if err != nil {
				return err
			}
			rs = append(rs, r)
		}
		name := fmt.Sprintf("~%gx", row.Load)
		ok, allows := rs.median(func(r ghzResult) float64 { return r.okPerSec }), rs.median(func(r ghzResult) float64 { return (1 - r.refusedPerSec*c.perRefusal) / c.perOK })
		fmt.Printf("%-8s %8d %8d %8.0f %6.2f %10.0f %9.0f %8s %7.0f %7.2f %10.0f%% %7.0f%%  %s\n", name, rate, row.Workers, ok, ok/capacity,
			rs.median(func(r ghzResult) float64 { return r.refusedPerSec }), rs.median(func(r ghzResult) float64 { return r.timedOutPerSec }),
			time.Duration(rs.median(func(r ghzResult) float64 { return float64(r.p99) })).Round(time.Millisecond), allows, ok/allows,
			100*rs.median(func(r ghzResult) float64 { return r.serverCPU }), 100*rs.median(func(r ghzResult) float64 { return r.ghzCPU }),
			rs.each(func(r ghzResult) (float64, float64) { return r.okPerSec, r.serverCPU }))
		ok, allows = rs.median(func(r ghzResult) float64 { return r.okMid }), rs.median(func(r ghzResult) float64 { return (1 - r.refusedMid*c.perRefusal) / r.perOKMid(c) })
		mids = append(mids, fmt.Sprintf("%-8s %8d %8d %8.0f %6.2f %10.0f %7.0f %7.0f %7.2f %11.0f%% %8.0f%%  %s", name, rate, row.Workers, ok, ok/capacity,
			rs.median(func(r ghzResult) float64 { return r.refusedMid }), 1e6*rs.median(func(r ghzResult) float64 { return r.burnMid }), allows, ok/allows,
			100*rs.median(func(r ghzResult) float64 { return r.serverCPUMid }), 100*rs.median(func(r ghzResult) float64 { return r.handlersMid }),
			rs.each(func(r ghzResult) (float64, float64) { return r.okMid, r.serverCPUMid })))
	}
	fmt.Println()
	fmt.Println("The same runs from 2 s after ghz starts to 1 s before it ends (its start and its last calls' timeouts left out), calls counted by when they ended.")
	fmt.Println("BURN: the handler's mean burn per call in this window (µs); ALLOWS: (1 s - REFUSED/s x refusal) / (BURN + an OK call's cost beside its burn,")
	fmt.Printf("%.1f µs in the capacity runs), so that the machine's speed in this window is the one the OK calls are weighed at; HANDLERS: the CPU share spent burning.\n", 1e6*c.okOverhead)
	fmt.Printf("%-8s %8s %8s %8s %6s %10s %7s %7s %7s %12s %9s  %s\n", "LOAD", "RATE", "WORKERS", "OK/s", "OK/C", "REFUSED/s", "BURN", "ALLOWS", "OK/ALL", "SERVER_CPU", "HANDLERS", "runs (OK/s @ server CPU)")
	for _, l := range mids {
		fmt.Println(l)
	}
	return nil
}

// runs are one row's repeats.
type runs []ghzResult

// median returns the median of f over the runs.
func (rs runs) median(f func(ghzResult) float64) float64 {
	var xs []float64
	for _, r := range rs {
		xs = append(xs, f(r))
	}
	return measure.Median(xs)
}

// each formats every run's OK calls/s and server CPU, as f gives them.
func (rs runs) each(f func(ghzResult) (ok, cpu float64)) string {
	var out []string
	for _, r := range rs {
		ok, cpu := f(r)
		out = append(out, fmt.Sprintf("%.0f@%.0f%%", ok, 100*cpu))
	}
	return strings.Join(out, " ")
}

// measureRefusal measures what one refusal costs the server: ghz at 20x C
// with 3,000 workers against a backend that refuses every call at
// arrival, the server's CPU over the refusals answered.
func measureRefusal(c *config, capacity float64) error {
	var per, rate, cpu []float64
	for i := 0; i < c.repeats; i++ {
		r, err := ghzRunOn(*c, true, []string{"-refuse-all"}, nil, "--rps", strconv.Itoa(int(20*capacity)), "-c", "3000")
		if err != nil {
			return err
		}
		if r.refusedPerSec <= 0 {
			return fmt.Errorf("the refusing backend refused nothing: %v", r.codes)
		}
		per, rate, cpu = append(per, r.serverCPU/r.refusedPerSec), append(rate, r.refusedPerSec), append(cpu, r.serverCPU)
	}
	c.perRefusal = measure.Median(per)
	fmt.Printf("refusal: %.1f µs of server CPU each (%.0f refusals/s at %.0f%% server CPU: ghz at 20x C, 3,000 workers, a backend refusing every call at arrival, median of %d)\n\n",
		c.perRefusal*1e6, measure.Median(rate), 100*measure.Median(cpu), c.repeats)
	return nil
}

// measureCapacity returns the unprotected backend's OK calls/s in a
// closed loop of 50 workers, the server's CPU-seconds per OK call, and
// how much of that is not the handler's burn.
func measureCapacity(c config) (rate, perOK, overhead float64, err error) {
	var xs, per, over []float64
	for i := 0; i < c.repeats; i++ {
		r, err := ghzRun(c, false, "-c", "50")
		if err != nil {
			return 0, 0, 0, err
		}
		xs, per = append(xs, r.okPerSec), append(per, r.serverCPU/r.okPerSec)
		over = append(over, r.serverCPU/r.okPerSec-r.burn)
	}
	return measure.Median(xs), measure.Median(per), measure.Median(over), nil
}

func startBackend(c config, protect bool, extra ...string) (*child.Process, error) {
	args := []string{"server", "-rounds", strconv.Itoa(c.rounds), "-protect=" + strconv.FormatBool(protect), "-stats=" + strconv.FormatBool(c.stats && protect), "-report-work"}
	if protect && c.maxStreams > 0 {
		args = append(args, "-max-streams", strconv.FormatUint(uint64(c.maxStreams), 10))
	}
	return child.Start("0", append(args, extra...)...)
}

// ghzResult is one ghz run.
type ghzResult struct {
	okPerSec, success float64
	refusedPerSec     float64 // calls answered with another code than OK
	timedOutPerSec    float64 // of which DeadlineExceeded: ghz's 1 s timeout, in its own queue or the server's
	p99               time.Duration
	serverCPU, ghzCPU float64
	// The same over the run's middle (window): from 2 s after ghz starts
	// to 1 s before its -z ends, the calls counted by when they ended.
	serverCPUMid, okMid, refusedMid float64
	// burn is the handler's mean burn per call over the whole run, and
	// burnMid over the window; handlersMid the share of the CPU the
	// handlers burned in the window.
	burn, burnMid, handlersMid float64
	codes                      map[string]int
	attackerLate, attack       int64
}

// perOKMid is an OK call's cost in the window: its burn there plus what it
// cost beside its burn in the capacity runs, or c.perOK where the window
// saw no call finish.
func (r ghzResult) perOKMid(c config) float64 {
	if r.burnMid <= 0 {
		return c.perOK
	}
	return r.burnMid + c.okOverhead
}

// ghzReport is what ghz --format json prints (the fields used here).
type ghzReport struct {
	Total        int64          `json:"total"` // ns
	Count        int64          `json:"count"`
	StatusCodes  map[string]int `json:"statusCodeDistribution"`
	LatencyDistr []struct {
		Percentage int   `json:"percentage"`
		Latency    int64 `json:"latency"`
	} `json:"latencyDistribution"`
	Details []struct {
		Timestamp time.Time `json:"timestamp"` // the call's start
		Latency   int64     `json:"latency"`   // ns
		Status    string    `json:"status"`
	} `json:"details"`
}

// endedWithin returns the OK calls and the others per second among those
// that ended within w.
func (rep *ghzReport) endedWithin(w window) (ok, other float64) {
	var n, m int
	for _, d := range rep.Details {
		if end := d.Timestamp.Add(time.Duration(d.Latency)); end.Before(w.from) || !end.Before(w.to) {
			continue
		}
		if d.Status == "OK" {
			n++
		} else {
			m++
		}
	}
	secs := w.to.Sub(w.from).Seconds()
	return float64(n) / secs, float64(m) / secs
}

// ghzRun starts a backend, runs ghz against it with the command
// line plus args, and measures the backend's CPU over the run.
func ghzRun(c config, protect bool, args ...string) (ghzResult, error) {
	return ghzRunWith(c, protect, nil, args...)
}

// ghzRunWith is ghzRun with beside, if not nil, running against the same
// backend from before ghz starts until it ends.
func ghzRunWith(c config, protect bool, beside func(ctx context.Context, addr string), args ...string) (ghzResult, error) {
	return ghzRunOn(c, protect, nil, beside, args...)
}

// ghzRunOn is ghzRunWith on a backend started with the extra server
// flags.
func ghzRunOn(c config, protect bool, extra []string, beside func(ctx context.Context, addr string), args ...string) (ghzResult, error) {
	var r ghzResult
	b, err := startBackend(c, protect, extra...)
	if err != nil {
		return r, err
	}
	defer b.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if beside != nil {
		wg.Add(1)
		go func() { defer wg.Done(); beside(ctx, b.Addr) }()
		time.Sleep(2 * time.Second) // the attack in its stride before the measurement
	}
	cmdArgs := append([]string{"--insecure", "--call", emptyCall, "--connections", "8", "--timeout", "1s",
		"-z", c.duration.String(), "--format", "json", "-m", `{"triage-criticality":"CRITICAL"}`}, args...)
	cmdArgs = append(cmdArgs, b.Addr)
	name := c.ghz
	if ts, err := exec.LookPath("taskset"); err == nil {
		cmdArgs = append([]string{"-c", "1", c.ghz}, cmdArgs...)
		name = ts
	}
	cmd := exec.Command(name, cmdArgs...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cpu0, wall0 := b.CPU(), time.Now()
	calls0, nanos0 := b.Work()
	mid := sampleMiddle(b, c.duration)
	err = cmd.Run()
	cpu1, wall := b.CPU(), time.Since(wall0)
	time.Sleep(150 * time.Millisecond) // the backend's next WORK line
	if calls1, nanos1 := b.Work(); calls1 > calls0 {
		r.burn = float64(nanos1-nanos0) / float64(calls1-calls0) / 1e9
	}
	w := <-mid
	cancel()
	wg.Wait()
	if err != nil {
		// ghz makes one call before its run and stops if it fails: the
		// backend served none of its calls.
		if msg := strings.TrimSpace(out.String() + errOut.String()); strings.HasPrefix(msg, "rpc error") {
			r.codes = map[string]int{msg: 1}
			r.serverCPU = (cpu1 - cpu0) / wall.Seconds()
			fmt.Fprintf(os.Stderr, "stockclient: ghz stopped at its first call: %s\n", msg)
			return r, nil
		}
		return r, fmt.Errorf("ghz %s: %v: %s", strings.Join(cmdArgs, " "), err, errOut.String())
	}
	var rep ghzReport
	if err := json.Unmarshal([]byte(out.String()), &rep); err != nil {
		return r, fmt.Errorf("ghz output: %v", err)
	}
	if rep.Total <= 0 || rep.Count == 0 {
		return r, fmt.Errorf("ghz made no calls")
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		used := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		r.ghzCPU = float64(used) / float64(rep.Total)
	}
	r.codes = rep.StatusCodes
	r.serverCPUMid = w.cpu
	if w.calls > 0 {
		r.burnMid = float64(w.nanos) / float64(w.calls) / 1e9
	}
	r.handlersMid = float64(w.nanos) / 1e9 / w.to.Sub(w.from).Seconds()
	r.okMid, r.refusedMid = rep.endedWithin(w)
	r.okPerSec = float64(rep.StatusCodes["OK"]) / (float64(rep.Total) / 1e9)
	r.refusedPerSec = float64(rep.Count-int64(rep.StatusCodes["OK"])) / (float64(rep.Total) / 1e9)
	r.timedOutPerSec = float64(rep.StatusCodes["DeadlineExceeded"]) / (float64(rep.Total) / 1e9)
	r.success = float64(rep.StatusCodes["OK"]) / float64(rep.Count)
	for _, p := range rep.LatencyDistr {
		if p.Percentage == 99 {
			r.p99 = time.Duration(p.Latency)
		}
	}
	r.serverCPU = (cpu1 - cpu0) / wall.Seconds()
	if c.stats {
		fmt.Fprintf(os.Stderr, "ghz %s: %v\n", strings.Join(args, " "), r.codes)
	}
	return r, nil
}

// window is a stretch of a run and the share of a CPU the backend used
// in it.
type window struct {
	from, to     time.Time
	cpu          float64
	calls, nanos int64 // the handlers' calls and burn (child.Process.Work)
}

// sampleMiddle returns the window from 2 s after now to 1 s before a run
// of d ends: ghz's start (its connections, the first call) and its last
// second (calls waiting out their timeout) are not steady load, and the
// whole run's figures include them. With d under 4 s the window is d.
func sampleMiddle(b *child.Process, d time.Duration) <-chan window {
	from, to := 2*time.Second, d-time.Second
	if to-from < time.Second {
		from, to = 0, d
	}
	out := make(chan window, 1)
	go func() {
		time.Sleep(from)
		c0, t0 := b.CPU(), time.Now()
		k0, n0 := b.Work()
		time.Sleep(to - from)
		c1, t1 := b.CPU(), time.Now()
		k1, n1 := b.Work()
		out <- window{from: t0, to: t1, cpu: (c1 - c0) / t1.Sub(t0).Seconds(), calls: k1 - k0, nanos: n1 - n0}
	}()
	return out
}
