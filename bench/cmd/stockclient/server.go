package main

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"runtime/trace"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/reflection"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/bench/internal/burn"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

// service is grpc.testing.TestService whose EmptyCall burns rounds sha256
// rounds: the README's protected server with a known cost per call.
type service struct {
	testgrpc.UnimplementedTestServiceServer
	rounds int
	// first, if set, runs once, after the first call (refuse-all's
	// ForceShed: ghz makes one call before its run and stops if it fails).
	first     func()
	firstOnce sync.Once
	// calls and nanos count the EmptyCalls finished and the time spent
	// burning in them (-report-work).
	calls, nanos atomic.Int64
}

var sink atomic.Uint64

func (s *service) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	start := time.Now()
	var sum [32]byte
	for i := 0; i < s.rounds; i++ {
		sum = sha256.Sum256(sum[:])
	}
	sink.Add(uint64(sum[0]))
	s.nanos.Add(int64(time.Since(start)))
	s.calls.Add(1)
	if s.first != nil {
		s.firstOnce.Do(s.first)
	}
	return &testgrpc.Empty{}, nil
}

// report prints the work done so far every 100 ms until ctx ends.
func (s *service) report(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fmt.Printf("WORK %d %d\n", s.calls.Load(), s.nanos.Load())
		}
	}
}

// StreamingOutputCall sends one response per response parameter, of its
// size (at most 1 MiB), burning no CPU: the slow readers' method.
func (s *service) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, st testgrpc.TestService_StreamingOutputCallServer) error {
	for _, p := range req.ResponseParameters {
		n := min(max(int(p.Size), 0), len(zeros))
		if err := st.Send(&testgrpc.StreamingOutputCallResponse{Payload: &testgrpc.Payload{Body: zeros[:n]}}); err != nil {
			return err
		}
	}
	return nil
}

// zeros is every response's body, shared: marshalling only reads it.
var zeros = make([]byte, 1<<20)

// serverCommand is "stockclient server": the backend, protected as the
// README shows (triagegrpc.NewServer(WithTrust(127.0.0.1/32),
// WithAdmission(admission.New()))) or not, with server reflection so that
// stock tools can call it. It prints "LISTEN addr" and serves on loopback
// until interrupted.
func serverCommand(args []string) error {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "listen address (loopback)")
	rounds := fs.Int("rounds", 0, "sha256 rounds per call (0: calibrate -cost)")
	cost := fs.Duration("cost", time.Millisecond, "CPU each EmptyCall burns, when -rounds is 0")
	protect := fs.Bool("protect", true, "triage's server with admission control, as the README shows")
	stats := fs.Bool("stats", false, "print the controller's state to stderr every 250 ms")
	measure := fs.String("measure", "scheduler", "the controller's queueing delay measure: scheduler or arrival (admission.WithDelayMeasure)")
	target := fs.Duration("target", admission.DefaultTargetDelay, "the controller's target delay (admission.WithTargetDelay)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole serving time to this file")
	reportWork := fs.Bool("report-work", false, "print \"WORK CALLS NANOS\" every 100 ms: the EmptyCalls finished and the nanoseconds spent burning in them (the burn is one goroutine's CPU loop on one CPU, so its time is CPU time but for the moments the kernel takes the CPU)")
	traceFile := fs.String("trace", "", "write an execution trace of one second, from -trace-after after listening, to this file")
	traceAfter := fs.Duration("trace-after", 5*time.Second, "when the -trace second begins, after listening")
	maxStreams := fs.Uint("max-streams", 0, "with -protect: the streams one connection may have open at once (grpc.MaxConcurrentStreams); 0 keeps triagegrpc's default")
	refuseAll := fs.Bool("refuse-all", false, "with -protect: refuse every call after the first at arrival (admission's ForceShed at every level), to measure what one refusal costs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := loopbackFlag("listen", *listen); err != nil {
		return err
	}
	if *refuseAll && !*protect {
		return fmt.Errorf("-refuse-all needs -protect")
	}
	if *rounds <= 0 {
		*rounds = burn.Calibrate(*cost)
	}
	var opts []grpc.ServerOption
	svc := &service{rounds: *rounds}
	if *protect {
		obs := &reasons{}
		m := admission.SchedulerDelay
		switch *measure {
		case "scheduler":
		case "arrival":
			m = admission.ArrivalDelay
		default:
			return fmt.Errorf("-measure must be scheduler or arrival, got %q", *measure)
		}
		ctl, err := admission.New(admission.WithObserver(obs), admission.WithDelayMeasure(m), admission.WithTargetDelay(*target))
		if err != nil {
			return err
		}
		if *refuseAll {
			svc.first = func() {
				for _, l := range criticality.All() {
					ctl.ForceShed(l, 1, admission.MaxForceShed) // valid arguments: no error
				}
			}
		}
		srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})), intake.WithAdmission(ctl)))
		if err != nil {
			return err
		}
		opts = srv.ServerOptions()
		if *maxStreams > 0 {
			if *maxStreams > 1<<20 {
				return fmt.Errorf("-max-streams must be at most %d, got %d", 1<<20, *maxStreams)
			}
			opts = append(opts, grpc.MaxConcurrentStreams(uint32(*maxStreams)))
		}
		if *stats {
			go printStats(ctl, obs)
		}
	}
	s := grpc.NewServer(opts...)
	testgrpc.RegisterTestServiceServer(s, svc)
	reflection.Register(s)
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *traceFile != "" {
		if err := traceLater(ctx, *traceFile, *traceAfter); err != nil {
			return err
		}
	}
	go func() { <-ctx.Done(); s.Stop() }()
	fmt.Printf("LISTEN %s\n", lis.Addr())
	os.Stdout.Sync()
	if *reportWork {
		go svc.report(ctx)
	}
	return s.Serve(lis)
}

func printStats(ctl *admission.Controller, obs *reasons) {
	for range time.Tick(250 * time.Millisecond) {
		st := ctl.Stats()
		fmt.Fprintf(os.Stderr, "limit %d pending %d/%.1f executing %d queued %d service %v delay %v saturated %v rejected %v\n",
			st.Limit, st.Pending, st.PendingCap, st.Executing, st.Queued, st.ServiceTime, st.QueueDelay, st.Saturated, obs.take())
	}
}

// reasons counts rejections by reason.
type reasons struct {
	n [admission.NumReasons]atomic.Int64
}

func (o *reasons) Observe(e admission.Event) {
	if e.Kind == admission.Rejected && e.Reason < admission.NumReasons {
		o.n[e.Reason].Add(1)
	}
}

func (o *reasons) take() map[string]int64 {
	m := map[string]int64{}
	for r := range o.n {
		if n := o.n[r].Swap(0); n > 0 {
			m[admission.Reason(r).String()] = n
		}
	}
	return m
}

// traceLater writes an execution trace of the second that begins after
// the given delay, unless ctx ends first.
func traceLater(ctx context.Context, name string, after time.Duration) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	go func() {
		defer f.Close()
		select {
		case <-ctx.Done():
			return
		case <-time.After(after):
		}
		if err := trace.Start(f); err != nil {
			fmt.Fprintln(os.Stderr, "trace:", err)
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
		trace.Stop()
		fmt.Fprintln(os.Stderr, "trace written to", name)
	}()
	return nil
}
