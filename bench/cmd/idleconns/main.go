// Command idleconns measures what idle clients cost a backend (SRE book
// ch. 21, "Load from Connections": "health checking on the connections can
// require more resources than actually serving the requests"). One backend
// process (GOMAXPROCS=1, pinned to one core) serves; this process, on the
// other core, starts N clients (default 2,000), each with its own
// connection, and each makes one call and then nothing. Two modes, one
// after the other, each against a fresh backend:
//
//   - active: the clients keep their connections, with what a connected
//     gRPC client keeps for liveness: a health Watch stream (client-side
//     health checking) and HTTP/2 keepalive pings (every 10 s, gRPC's
//     minimum), standing for the book's periodic health checks;
//   - idle: the same clients with triage's idle mode
//     (triagegrpc.WithIdleTimeout; a short timeout here so the run is
//     short): after the timeout each drops its connection and keeps
//     nothing; its next call reconnects, and watches health before its
//     first pick, so it learns of lame duck then.
//
// Over the same hold time it reports, per client, the backend's CPU and
// its memory (Go heap and stacks in use after a GC, and RSS), above those
// of a third backend that has no clients at all; then it wakes every
// client with one more call and reports failures and wake-up time.
//
//	go run ./cmd/idleconns
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/triagehq/triage/bench/internal/child"
	"github.com/triagehq/triage/bench/internal/clientopts"
	"github.com/triagehq/triage/connload"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/internal/measure"
	"github.com/triagehq/triage/triagegrpc"
)

const (
	callMethod  = "/triage.bench.Idle/Call"
	statsMethod = "/triage.bench.Idle/Stats"
)

type config struct {
	clients   int
	hold      time.Duration
	settle    time.Duration
	idle      time.Duration
	keepalive time.Duration
	serverCPU string
	loadCPU   string
	asJSON    bool
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "server" {
		if err := serverMain(); err != nil {
			fmt.Fprintln(os.Stderr, "idleconns server:", err)
			os.Exit(1)
		}
		return
	}
	var c config
	fs := flag.NewFlagSet("idleconns", flag.ContinueOnError)
	fs.IntVar(&c.clients, "clients", 2000, "clients, each with its own connection (1-20000)")
	fs.DurationVar(&c.hold, "hold", 20*time.Second, "measured time with every client idle")
	fs.DurationVar(&c.settle, "settle", 10*time.Second, "wait after every client has settled in its mode, before measuring (going idle costs the backend once: closing connections, then its runtime returning their memory)")
	fs.DurationVar(&c.idle, "idle-timeout", 2*time.Second, "the idle mode's timeout (triage's default is 5m; short here to keep the run short)")
	fs.DurationVar(&c.keepalive, "keepalive", 10*time.Second, "keepalive ping interval of connected clients (gRPC's minimum is 10s)")
	fs.StringVar(&c.serverCPU, "server-cpu", "0", "CPU to pin the backend to (taskset), empty for none")
	fs.StringVar(&c.loadCPU, "load-cpu", "1", "CPU to pin the clients to (taskset), empty for none")
	fs.BoolVar(&c.asJSON, "json", false, "print one JSON object")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if c.clients < 1 || c.clients > 20000 || c.hold < time.Second || c.hold > 10*time.Minute || c.settle < 0 || c.settle > 10*time.Minute ||
		c.idle <= 0 || c.idle > time.Minute || c.keepalive < 10*time.Second {
		fmt.Fprintln(os.Stderr, "idleconns: need 1 <= clients <= 20000, 1s <= hold <= 10m, 0 <= settle <= 10m, 0 < idle-timeout <= 1m, keepalive >= 10s")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	child.PinSelf(c.loadCPU)
	var results []result // none (the baseline: a backend with no clients), active, idle
	for _, mode := range []string{"none", "active", "idle"} {
		r, err := runMode(ctx, c, mode)
		if err != nil {
			fmt.Fprintf(os.Stderr, "idleconns: %s: %v\n", mode, err)
			os.Exit(1)
		}
		results = append(results, r)
	}
	// Per client, above the baseline of the same backend with no clients.
	for i := 1; i < len(results); i++ {
		results[i].CPUMicrosPerSec -= results[0].CPUMicrosPerSec
		results[i].HeapStackKB -= results[0].HeapStackKB
		results[i].RSSKB -= results[0].RSSKB
	}
	if c.asJSON {
		json.NewEncoder(os.Stdout).Encode(map[string]any{"clients": c.clients, "hold_s": c.hold.Seconds(), "results": results[1:],
			"baseline_cpu_s_per_s": results[0].CPUMicrosPerSec * float64(c.clients) / 1e6})
		return
	}
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%d idle clients held for %v against one backend (GOMAXPROCS=1); per client, above a backend with no clients (%.2f ms/s of CPU)\n",
		c.clients, c.hold, results[0].CPUMicrosPerSec*float64(c.clients)/1e3)
	fmt.Fprintln(tw, "mode\topen conns\tCPU µs/s per client\theap+stack KB per client\tRSS KB per client\thealth checks/s\twake failed\twake p50 ms\twake max ms\t")
	for _, r := range results[1:] {
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%.1f\t%d/%d\t%.1f\t%.1f\t\n", r.Mode, r.Open, r.CPUMicrosPerSec, r.HeapStackKB, r.RSSKB,
			r.HealthChecksPerSec, r.WakeFailed, c.clients, r.WakeP50MS, r.WakeMaxMS)
	}
	tw.Flush()
	if a, i := results[1], results[2]; a.HeapStackKB > 0 && a.CPUMicrosPerSec > 0 && a.RSSKB > 0 {
		fmt.Printf("idle / active: CPU %.3f, heap+stack %.3f, RSS %.3f\n", i.CPUMicrosPerSec/a.CPUMicrosPerSec, i.HeapStackKB/a.HeapStackKB, i.RSSKB/a.RSSKB)
	}
}

// result is one mode's per-client costs on the backend.
type result struct {
	Mode               string  `json:"mode"`
	Open               int64   `json:"open"` // the backend's open connections during the hold (besides this tool's own)
	CPUMicrosPerSec    float64 `json:"cpu_us_per_s_per_client"`
	HeapStackKB        float64 `json:"heap_stack_kb_per_client"`
	RSSKB              float64 `json:"rss_kb_per_client"`
	HealthChecksPerSec float64 `json:"health_checks_per_s"`
	WakeFailed         int     `json:"wake_failed"`
	WakeP50MS          float64 `json:"wake_p50_ms"`
	WakeMaxMS          float64 `json:"wake_max_ms"`
}

// serverStats is what the backend's Stats method answers.
type serverStats struct {
	Open, Busy, HealthChecks int64
	HeapStack                uint64 // Go heap and stacks in use after a GC
	Goroutines               int
}

func runMode(ctx context.Context, c config, mode string) (result, error) {
	r := result{Mode: mode}
	srv, err := child.Start(c.serverCPU, "server")
	if err != nil {
		return r, err
	}
	defer srv.Stop()
	ctl, err := grpc.NewClient("passthrough:///"+srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return r, err
	}
	defer ctl.Close()
	stats := func() (serverStats, error) {
		var s serverStats
		out := new(wrapperspb.StringValue)
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := ctl.Invoke(sctx, statsMethod, wrapperspb.String(""), out); err != nil {
			return s, err
		}
		return s, json.Unmarshal([]byte(out.Value), &s)
	}
	base, err := stats()
	if err != nil {
		return r, err
	}
	rss0 := rss(srv.Pid)

	idle := time.Duration(0) // active: never idle
	if mode == "idle" {
		idle = c.idle
	}
	opts := append(clientopts.MustDial([]egress.Option{egress.WithoutPolicy()}, triagegrpc.WithIdleTimeout(idle)),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: c.keepalive, Timeout: 20 * time.Second, PermitWithoutStream: true}),
		grpc.WithDefaultServiceConfig(`{"healthCheckConfig": {"serviceName": ""}}`))
	clients := c.clients
	if mode == "none" {
		clients = 0
	}
	ccs := make([]*grpc.ClientConn, clients)
	defer func() {
		for _, cc := range ccs {
			if cc != nil {
				cc.Close()
			}
		}
	}()
	for i := range ccs {
		if ccs[i], err = grpc.NewClient("passthrough:///"+srv.Addr, opts...); err != nil {
			return r, err
		}
	}
	// Every client makes one call, 200 at a time.
	if failed, _ := callAll(ctx, ccs); failed > 0 && mode != "none" {
		return r, fmt.Errorf("%d of %d first calls failed", failed, len(ccs))
	}
	// Let the mode settle: active clients stay connected; idle ones drop
	// their connections after the timeout.
	want := func(s serverStats) bool {
		if mode == "idle" {
			return s.Open <= base.Open
		}
		return s.Open >= base.Open+int64(clients)
	}
	deadline := time.Now().Add(c.idle + 30*time.Second)
	for {
		s, err := stats()
		if err != nil {
			return r, err
		}
		if want(s) {
			break
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("the backend holds %d connections, not settling", s.Open)
		}
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	select {
	case <-ctx.Done():
		return r, ctx.Err()
	case <-time.After(c.settle):
	}
	s0, _ := stats() // (its GC outside the measured time)
	cpu0 := srv.CPU()
	select {
	case <-ctx.Done():
		return r, ctx.Err()
	case <-time.After(c.hold):
	}
	cpu1 := srv.CPU()
	s1, err := stats()
	if err != nil {
		return r, err
	}
	n := float64(c.clients)
	r.Open = s1.Open - base.Open
	r.CPUMicrosPerSec = (cpu1 - cpu0) / c.hold.Seconds() / n * 1e6 // the whole process's, per client; see main for the baseline
	r.HeapStackKB = (float64(s1.HeapStack) - float64(base.HeapStack)) / n / 1024
	r.RSSKB = float64(rss(srv.Pid)-rss0) / n / 1024
	r.HealthChecksPerSec = float64(s1.HealthChecks-s0.HealthChecks) / c.hold.Seconds()
	// Wake every client.
	var wakes []time.Duration
	r.WakeFailed, wakes = callAll(ctx, ccs)
	if len(wakes) > 0 {
		slices.Sort(wakes)
		r.WakeP50MS, r.WakeMaxMS = float64(measure.QuantileDuration(wakes, 0.5))/1e6, float64(wakes[len(wakes)-1])/1e6
	}
	return r, nil
}

// callAll makes one call on each connection, 200 at a time, and returns
// the failures and the successes' latencies.
func callAll(ctx context.Context, ccs []*grpc.ClientConn) (int, []time.Duration) {
	var mu sync.Mutex
	var lat []time.Duration
	failed := 0
	sem := make(chan struct{}, 200)
	var wg sync.WaitGroup
	for _, cc := range ccs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			t0 := time.Now()
			err := cc.Invoke(cctx, callMethod, wrapperspb.String("x"), new(wrapperspb.StringValue))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
				return
			}
			lat = append(lat, time.Since(t0))
		}()
	}
	wg.Wait()
	return failed, lat
}

// rss is process pid's resident set in bytes (measure.RSS), 0 if it is
// gone.
func rss(pid int) int64 {
	n, _ := measure.RSS(pid)
	return n
}

// serverMain is the backend: connections counted by connload (no accept
// bound: this is not a storm), a health service, keepalive pings allowed
// every 10 s, an empty Call and a Stats method.
func serverMain() error {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	cl, err := connload.NewListener(lis, connload.WithAcceptRate(0, 0), connload.WithMaxOpen(0))
	if err != nil {
		return err
	}
	ts, err := triagegrpc.NewServer(triagegrpc.WithConnLoad(cl))
	if err != nil {
		return err
	}
	s := grpc.NewServer(append(ts.ServerOptions(),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}))...)
	unary := func(name string, h func(*wrapperspb.StringValue) (*wrapperspb.StringValue, error)) grpc.MethodDesc {
		return grpc.MethodDesc{MethodName: name, Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			return h(in)
		}}
	}
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: "triage.bench.Idle",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			unary("Call", func(in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) { return in, nil }),
			unary("Stats", func(*wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
				runtime.GC()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				st := cl.Stats()
				b, err := json.Marshal(serverStats{Open: st.Open, Busy: st.Busy, HealthChecks: st.HealthChecks,
					HeapStack: ms.HeapInuse + ms.StackInuse, Goroutines: runtime.NumGoroutine()})
				if err != nil {
					return nil, errors.New("stats: " + err.Error())
				}
				return wrapperspb.String(string(b)), nil
			}),
		},
	}, struct{}{})
	healthpb.RegisterHealthServer(s, health.NewServer())
	fmt.Printf("LISTEN %s\n", cl.Addr())
	os.Stdout.Sync()
	return s.Serve(cl)
}
