package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
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
	"github.com/triagehq/triage/bench/internal/child"
	"github.com/triagehq/triage/internal/measure"
	"github.com/triagehq/triage/triagegrpc"
)

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
		fmt.Printf("%-22s %9.3f%% %10v %10.0f %11.0f%%  %s\n", name, 100*measure.Median(succ), time.Duration(measure.Median(p99)).Round(10*time.Microsecond), measure.Median(ok), 100*measure.Median(cpu), counts)
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
