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
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/bench/internal/burn"
	"github.com/triagehq/triage/bench/internal/child"
	"github.com/triagehq/triage/bench/internal/stockrows"
	"github.com/triagehq/triage/triagegrpc"
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
	stats             bool
	rows              string
	attacker          string
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
		measured, perOK, err := measureCapacity(c)
		if err != nil {
			return err
		}
		fmt.Printf("capacity: %.0f OK calls/s, %.1f µs of server CPU each (ghz closed loop, 50 workers, unprotected backend, cost %v, median of %d)\n", measured, perOK*1e6, c.cost, c.repeats)
		if capacity <= 0 {
			capacity = measured
		}
		c.perOK = perOK
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
	fmt.Println("ALLOWS: the OK calls/s one CPU allows after the refusals' own cost, (1 s - REFUSED/s x refusal) / OK call")
	fmt.Printf("%-8s %8s %8s %10s %7s %10s %8s %8s %12s %9s  %s\n", "LOAD", "RATE", "WORKERS", "OK/s", "OK/C", "REFUSED/s", "ALLOWS", "OK/ALL", "SERVER_CPU", "GHZ_CPU", "runs (OK/s @ server CPU)")
	for _, row := range rows {
		rate := int(row.Load * capacity)
		var ok, refused, allows, cpu, gcpu []float64
		var runs []string
		for i := 0; i < c.repeats; i++ {
			r, err := ghzRun(c, true, "--rps", strconv.Itoa(rate), "-c", strconv.Itoa(row.Workers))
			if err != nil {
				return err
			}
			ok, refused, cpu, gcpu = append(ok, r.okPerSec), append(refused, r.refusedPerSec), append(cpu, r.serverCPU), append(gcpu, r.ghzCPU)
			allows = append(allows, (1-r.refusedPerSec*c.perRefusal)/c.perOK)
			runs = append(runs, fmt.Sprintf("%.0f@%.0f%%", r.okPerSec, 100*r.serverCPU))
		}
		fmt.Printf("%-8s %8d %8d %10.0f %7.2f %10.0f %8.0f %8.2f %11.0f%% %8.0f%%  %s\n", fmt.Sprintf("~%gx", row.Load), rate, row.Workers,
			median(ok), median(ok)/capacity, median(refused), median(allows), median(ok)/median(allows), 100*median(cpu), 100*median(gcpu), strings.Join(runs, " "))
	}
	return nil
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
	c.perRefusal = median(per)
	fmt.Printf("refusal: %.1f µs of server CPU each (%.0f refusals/s at %.0f%% server CPU: ghz at 20x C, 3,000 workers, a backend refusing every call at arrival, median of %d)\n\n",
		c.perRefusal*1e6, median(rate), 100*median(cpu), c.repeats)
	return nil
}

// measureCapacity returns the unprotected backend's OK calls/s in a
// closed loop of 50 workers, and the server's CPU-seconds per OK call.
func measureCapacity(c config) (float64, float64, error) {
	var xs, per []float64
	for i := 0; i < c.repeats; i++ {
		r, err := ghzRun(c, false, "-c", "50")
		if err != nil {
			return 0, 0, err
		}
		xs, per = append(xs, r.okPerSec), append(per, r.serverCPU/r.okPerSec)
	}
	return median(xs), median(per), nil
}

func startBackend(c config, protect bool, extra ...string) (*child.Process, error) {
	return child.Start("0", append([]string{"server", "-rounds", strconv.Itoa(c.rounds), "-protect=" + strconv.FormatBool(protect), "-stats=" + strconv.FormatBool(c.stats && protect)}, extra...)...)
}

// ghzResult is one ghz run.
type ghzResult struct {
	okPerSec, success    float64
	refusedPerSec        float64 // calls answered with another code than OK
	p99                  time.Duration
	serverCPU, ghzCPU    float64
	codes                map[string]int
	attackerLate, attack int64
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
	err = cmd.Run()
	cpu1, wall := b.CPU(), time.Since(wall0)
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
	r.okPerSec = float64(rep.StatusCodes["OK"]) / (float64(rep.Total) / 1e9)
	r.refusedPerSec = float64(rep.Count-int64(rep.StatusCodes["OK"])) / (float64(rep.Total) / 1e9)
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

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// attackScenario: steady CRITICAL traffic at 0.8 C from ghz (50 workers),
// alone, then beside the scenario's attacker, claiming CRITICAL too, over
// 8 connections of its own: slow senders (1,000 streams that send their
// message 900 ms after their headers) or slow readers (200 streams of
// StreamingOutputCall asking for 64 MiB each that their client never
// reads).
func attackScenario(c config, capacity float64) error {
	rate := strconv.Itoa(int(0.8 * capacity))
	what, note := "slow senders: 1,000 streams, message 900 ms after headers", "slow senders' calls (refused late / all)"
	if c.scenario == "readers" {
		what, note = "slow readers: 200 streams of 64 MiB never read", "slow readers' streams (attempts refused / admitted)"
	}
	fmt.Printf("steady: ghz --rps %s -c 50, CRITICAL; %s, CRITICAL\n\n", rate, what)
	fmt.Printf("%-22s %10s %10s %10s %12s  %s\n", "RUN", "SUCCESS", "P99", "OK/s", "SERVER_CPU", note)
	for _, attacked := range []bool{false, true} {
		var succ, p99, ok, cpu []float64
		var sum attackCounts
		for i := 0; i < c.repeats; i++ {
			var a attackCounts
			var beside func(context.Context, string)
			if attacked {
				beside = func(ctx context.Context, addr string) { a = runAttacker(ctx, c.attacker, c.scenario, addr) }
			}
			r, err := ghzRunWith(c, true, beside, "--rps", rate, "-c", "50")
			if err != nil {
				return err
			}
			succ, p99, ok, cpu = append(succ, r.success), append(p99, float64(r.p99)), append(ok, r.okPerSec), append(cpu, r.serverCPU)
			sum.Late += a.Late
			sum.Calls += a.Calls
		}
		name := "steady alone"
		counts := ""
		if attacked {
			name = "steady + " + c.scenario
			counts = fmt.Sprintf("%d / %d", sum.Late, sum.Calls)
		}
		fmt.Printf("%-22s %9.3f%% %10v %10.0f %11.0f%%  %s\n", name, 100*median(succ), time.Duration(median(p99)).Round(10*time.Microsecond), median(ok), 100*median(cpu), counts)
	}
	return nil
}

// attackCounts is what the attacker saw: the slow senders' calls, and
// those refused as late; the slow readers' streams admitted (Calls), and
// their attempts refused (Late).
type attackCounts struct{ Calls, Late int64 }

// runAttacker runs the scenario's attacker (slow senders: 1,000 streams
// over 8 connections, each sending its message 900 ms after its headers;
// slow readers: 200 streams over 8 connections never read) against addr
// until ctx ends: in this process (where "inproc"), or in a process of
// their own on CPU 1 at nice 19 (where "low"), so that their client-side
// work does not delay ghz's calls on the CPU they share, as it would not
// from another machine.
func runAttacker(ctx context.Context, where, scenario, addr string) attackCounts {
	if where == "inproc" {
		return attack(ctx, scenario, addr)
	}
	var n attackCounts
	if err := child.RunLowUntil(ctx, "1", &n, "attack", "-kind", scenario, "-addr", addr); err != nil {
		fmt.Fprintln(os.Stderr, "stockclient: attacker:", err)
	}
	return n
}

// attack runs the attacker of kind "slow" or "readers" until ctx ends.
func attack(ctx context.Context, kind, addr string) attackCounts {
	if kind == "readers" {
		r := &readers{streams: 200, conns: 8, size: 64 << 10, count: 1024}
		r.run(ctx, addr)
		return attackCounts{Calls: r.admitted.Load(), Late: r.refused.Load()}
	}
	a := &attacker{streams: 1000, delay: 900 * time.Millisecond, conns: 8}
	a.run(ctx, addr)
	return attackCounts{Calls: a.calls.Load(), Late: a.late.Load()}
}

// attackCommand is "stockclient attack": the attacker of -kind against
// -addr until interrupted; then it prints its counts as JSON.
func attackCommand(args []string) error {
	fs := flag.NewFlagSet("attack", flag.ContinueOnError)
	addr := fs.String("addr", "", "the backend (loopback)")
	kind := fs.String("kind", "slow", "slow (slow senders) or readers (slow readers)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := loopbackFlag("addr", *addr); err != nil {
		return err
	}
	if *kind != "slow" && *kind != "readers" {
		return fmt.Errorf("-kind must be slow or readers, got %q", *kind)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	runtime.GOMAXPROCS(1)
	return json.NewEncoder(os.Stdout).Encode(attack(ctx, *kind, *addr))
}

// readers opens streams of StreamingOutputCall, each asking for count
// responses of size bytes, reads the first (which says it was admitted)
// and no more; a stream refused is tried again after 100 ms. Its
// connections have fixed 64 KiB flow-control windows, as a client that
// does not read has in effect (grpc's default would grow them, by its
// bandwidth estimate, up to 16 MiB a stream).
type readers struct {
	streams, conns, size, count int
	admitted, refused           atomic.Int64
}

func (r *readers) run(ctx context.Context, addr string) {
	var ccs []*grpc.ClientConn
	for i := 0; i < r.conns; i++ {
		cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
		if err != nil {
			return
		}
		defer cc.Close()
		ccs = append(ccs, cc)
	}
	ctx = metadata.AppendToOutgoingContext(ctx, "triage-criticality", "CRITICAL")
	req := &testgrpc.StreamingOutputCallRequest{}
	for range r.count {
		req.ResponseParameters = append(req.ResponseParameters, &testgrpc.ResponseParameters{Size: int32(r.size)})
	}
	var wg sync.WaitGroup
	for i := 0; i < r.streams; i++ {
		wg.Add(1)
		go func(c testgrpc.TestServiceClient) {
			defer wg.Done()
			for ctx.Err() == nil {
				st, err := c.StreamingOutputCall(ctx, req)
				if err == nil {
					// Its first response says it was admitted; the rest
					// it never reads.
					if _, err = st.Recv(); err == nil {
						r.admitted.Add(1)
						<-ctx.Done()
						return
					}
				}
				if ctx.Err() == nil {
					r.refused.Add(1)
				}
				select {
				case <-time.After(100 * time.Millisecond):
				case <-ctx.Done():
				}
			}
		}(testgrpc.NewTestServiceClient(ccs[i%len(ccs)]))
	}
	wg.Wait()
}

// attacker holds streams open with their headers sent and sends each
// stream's message delay later, again and again.
type attacker struct {
	streams, conns int
	delay          time.Duration
	calls, late    atomic.Int64
}

func (a *attacker) run(ctx context.Context, addr string) {
	var ccs []*grpc.ClientConn
	for i := 0; i < a.conns; i++ {
		cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return
		}
		defer cc.Close()
		ccs = append(ccs, cc)
	}
	ctx = metadata.AppendToOutgoingContext(ctx, "triage-criticality", "CRITICAL")
	desc := &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}
	var wg sync.WaitGroup
	for i := 0; i < a.streams; i++ {
		wg.Add(1)
		go func(cc *grpc.ClientConn) {
			defer wg.Done()
			for ctx.Err() == nil {
				cctx, cancel := context.WithTimeout(ctx, 2*a.delay+time.Second)
				cs, err := cc.NewStream(cctx, desc, "/"+emptyCall)
				if err != nil {
					cancel()
					time.Sleep(10 * time.Millisecond) // no stream: the connection is not ready
					continue
				}
				select {
				case <-time.After(a.delay):
				case <-ctx.Done():
				}
				if cs.SendMsg(&testgrpc.Empty{}) == nil && cs.CloseSend() == nil {
					err = cs.RecvMsg(new(testgrpc.Empty))
					a.calls.Add(1)
					if oe, ok := triagegrpc.FromStatus(status.Convert(err)); ok && oe.Reason == admission.Late.String() {
						a.late.Add(1)
					}
				}
				cancel()
			}
		}(ccs[i%len(ccs)])
	}
	wg.Wait()
}

// loopbackFlag checks that flag name's value addr is a loopback host:port:
// every run stays on this machine.
func loopbackFlag(name, addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("-%s must be a loopback address, got %q", name, addr)
	}
	return nil
}
