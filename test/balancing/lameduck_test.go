package balancing

// Issue 5: lame duck and clean shutdown with real processes. The test
// binary runs itself as a backend (TestBackendProcess, active only with
// TRIAGE_E2E_BACKEND set): SIGTERM puts it in lame duck, it serves on for
// the drain interval, then stops gracefully and prints what it saw.

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/loadreport"
	"github.com/triagehq/triage/triagegrpc"
)

const backendEnv = "TRIAGE_E2E_BACKEND"

// TestBackendProcess is the backend process of the lame duck tests: it
// listens on $TRIAGE_E2E_BACKEND, serves 20 ms requests, and on SIGTERM
// enters lame duck, drains for 1 s and stops. It prints "ready" when
// serving and, at exit, how many requests arrived more than 500 ms after
// lame duck began, were served in all, arrived in lame duck, were in flight
// at SIGTERM, and completed after it.
func TestBackendProcess(t *testing.T) {
	addr := os.Getenv(backendEnv)
	if addr == "" {
		t.Skip("the lame duck tests run this as a separate process")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	var lameAt atomic.Int64
	var served, late, afterLame, inflight atomic.Int64
	m, err := loadreport.New(loadreport.WithWindow(2*time.Second), loadreport.WithUtilization(func() float64 { return 0.5 }))
	if err != nil {
		t.Fatal(err)
	}
	hs := health.NewServer()
	lc, err := triagegrpc.NewLifecycle(hs, lifecycle.WithDrain(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	srvTriage, err := triagegrpc.NewServer(triagegrpc.WithLoadReports(m), triagegrpc.WithLifecycle(lc))
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(srvTriage.ServerOptions()...)
	healthpb.RegisterHealthServer(gs, hs)
	relay.Register(gs, &relay.Tier{Name: "B", Fail: func(ctx context.Context, body string) error {
		if at := lameAt.Load(); at != 0 {
			afterLame.Add(1)
			if time.Now().UnixNano()-at > int64(500*time.Millisecond) {
				late.Add(1)
			}
		}
		inflight.Add(1)
		time.Sleep(20 * time.Millisecond)
		served.Add(1)
		inflight.Add(-1)
		return nil
	}})
	lis, err := loopback.ListenRetry(addr) // the previous process may still hold the port for a moment
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- gs.Serve(lis) }()
	fmt.Println("ready")
	<-ctx.Done()
	lameAt.Store(time.Now().UnixNano())
	inflightAtLame, servedAtLame := inflight.Load(), served.Load()
	if err := lc.Shutdown(context.Background(), triagegrpc.GracefulStop(gs)); err != nil {
		t.Fatal(err)
	}
	<-done
	fmt.Printf("late=%d served=%d lameduck_arrived=%d inflight_at_lameduck=%d completed_after=%d\n",
		late.Load(), served.Load(), afterLame.Load(), inflightAtLame, served.Load()-servedAtLame)
}

// backendProc is one backend process.
type backendProc struct {
	addr  string
	cmd   *exec.Cmd
	lines chan string
}

func startProc(t *testing.T, addr string) *backendProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestBackendProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), backendEnv+"="+addr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &backendProc{addr: addr, cmd: cmd, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default: // unexpected chatter; never block the process
			}
		}
		close(p.lines)
	}()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	p.expect(t, "ready")
	return p
}

// startProcs starts n backend processes on free loopback ports.
func startProcs(t *testing.T, n int) ([]*backendProc, []string) {
	t.Helper()
	var procs []*backendProc
	var addrs []string
	for range n {
		p := startProc(t, loopback.FreeAddr(t))
		procs = append(procs, p)
		addrs = append(addrs, p.addr)
	}
	return procs, addrs
}

// expect waits for a line starting with prefix and returns it.
func (p *backendProc) expect(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("backend %s exited before printing %q", p.addr, prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-timeout:
			t.Fatalf("backend %s: no %q line after 20 s", p.addr, prefix)
		}
	}
}

// call is one request of the background load.
type call struct {
	start, end time.Time
	peer       string
	err        error
}

// steadyLoad sends rate requests per second until stop is closed (at most
// max), recording every call; wait returns the record.
func steadyLoad(cc grpc.ClientConnInterface, rate int, max time.Duration, stop <-chan struct{}) (wait func() []call) {
	var (
		mu    sync.Mutex
		calls []call
		wg    sync.WaitGroup
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		start := time.Now()
		tick := time.Second / time.Duration(rate)
		for i := 0; time.Since(start) < max; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Until(start.Add(time.Duration(i) * tick))):
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				var p peer.Peer
				c := call{start: time.Now()}
				_, c.err = relay.Invoke(ctx, cc, "x", grpc.Peer(&p))
				c.end = time.Now()
				if p.Addr != nil {
					c.peer = p.Addr.String()
				}
				mu.Lock()
				calls = append(calls, c)
				mu.Unlock()
			}()
		}
	}()
	return func() []call {
		<-done
		wg.Wait()
		return calls
	}
}

const lameDuckConfig = `{"loadBalancingConfig":[{"triage":{"policy":"round_robin"}}],"healthCheckConfig":{"serviceName":""}}`

// TestRollingRestart: three backend processes under steady load; each in
// turn gets SIGTERM (lame duck, 1 s drain, graceful stop) and is started
// again before the next goes, for two rounds (one in go test ./..., two
// with TRIAGE_MEASURE=1). No request may fail, and no
// new request may reach a backend later than 500 ms after it entered lame
// duck.
func TestRollingRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and restarts backend processes")
	}
	alongside(t)
	procs, addrs := startProcs(t, 3)
	cc := lbConn(t, addrs, lameDuckConfig)
	stop := make(chan struct{})
	wait := steadyLoad(cc, 150, 60*time.Second, stop)
	time.Sleep(time.Second)
	var lateTotal int
	rounds := 1 // every backend restarted once in go test ./...
	if measuring() {
		rounds = 2
	}
	for round := range rounds {
		for i, p := range procs {
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			final := p.expect(t, "late=")
			p.cmd.Wait()
			var late, served, lame, inflight, completed int
			if _, err := fmt.Sscanf(final, "late=%d served=%d lameduck_arrived=%d inflight_at_lameduck=%d completed_after=%d", &late, &served, &lame, &inflight, &completed); err != nil {
				t.Fatalf("backend said %q: %v", final, err)
			}
			t.Logf("round %d, backend %d: served %d; at SIGTERM %d in flight, %d completed after it; %d arrived in lame duck, %d of them more than 500 ms in", round, i, served, inflight, completed, lame, late)
			if completed < inflight {
				t.Errorf("backend %d: %d requests in flight at SIGTERM, only %d completed", i, inflight, completed)
			}
			lateTotal += late
			procs[i] = startProc(t, p.addr)
			time.Sleep(2500 * time.Millisecond) // clients reconnect before the next one goes
		}
	}
	close(stop)
	calls := wait()
	failed := 0
	for _, c := range calls {
		if c.err != nil {
			failed++
			if failed <= 5 {
				t.Logf("failed at %v: %v", c.start.Format("15:04:05.000"), c.err)
			}
		}
	}
	t.Logf("%d requests over %d rolling restarts of 3 backends, %d failed", len(calls), rounds, failed)
	if failed > 0 {
		t.Errorf("%d of %d requests failed during rolling restarts, want 0", failed, len(calls))
	}
	if lateTotal > 0 {
		t.Errorf("%d requests reached a backend more than 500 ms after it entered lame duck", lateTotal)
	}
}

// TestKillBackend: SIGKILL one of three backends under steady load. The
// only failures may be requests that were already on their way to it, and
// requests must stop failing within 1 s.
func TestKillBackend(t *testing.T) {
	if testing.Short() {
		t.Skip("starts backend processes")
	}
	alongside(t)
	procs, addrs := startProcs(t, 3)
	cc := lbConn(t, addrs, lameDuckConfig)
	stop := make(chan struct{})
	wait := steadyLoad(cc, 150, 20*time.Second, stop)
	time.Sleep(2 * time.Second)
	killed := procs[0]
	killAt := time.Now()
	if err := killed.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	close(stop)
	calls := wait()
	// In flight on the killed backend: requests sent to it that had not
	// completed when it died, including those sent before the client saw
	// the connection drop (the kernel resets it at once on loopback).
	var failed, inflight, lateFail, elsewhere int
	for _, c := range calls {
		if c.peer == killed.addr && !c.end.Before(killAt) {
			inflight++
		}
		if c.err == nil {
			continue
		}
		failed++
		if c.peer != killed.addr {
			elsewhere++
			t.Logf("failed elsewhere: sent %v after the kill, peer %q: %v", c.start.Sub(killAt), c.peer, c.err)
		}
		if c.start.After(killAt.Add(time.Second)) {
			lateFail++
		}
	}
	t.Logf("SIGKILL: %d requests in flight on the killed backend, %d failed in all (%d on other backends), %d of them sent more than 1 s after the kill", inflight, failed, elsewhere, lateFail)
	if failed > inflight || elsewhere > 0 {
		t.Errorf("%d requests failed (%d on other backends), more than the %d in flight on the killed backend", failed, elsewhere, inflight)
	}
	if lateFail > 0 {
		t.Errorf("%d requests sent more than 1 s after the kill failed", lateFail)
	}
}
