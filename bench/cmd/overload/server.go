package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-kratos/aegis/ratelimit"
	"github.com/go-kratos/aegis/ratelimit/bbr"
	"github.com/zeromicro/go-zero/core/load"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/bench/internal/statetrace"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/measure"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

// The benchmark's service: one unary method that burns CPU.
const method = "/triage.bench.Burn/Burn"

type burnServer interface{}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: "triage.bench.Burn",
	HandlerType: (*burnServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Burn",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				return srv.(*burner).burn(ctx, req.(*wrapperspb.StringValue))
			}
			if interceptor == nil {
				return h(ctx, in)
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: method}, h)
		},
	}},
	Metadata: "bench",
}

// burner burns a calibrated amount of CPU per request.
type burner struct {
	rounds int // sha256 rounds per request
}

var sink atomic.Uint64

func (b *burner) burn(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	var sum [32]byte
	copy(sum[:], in.GetValue())
	for i := 0; i < b.rounds; i++ {
		sum = sha256.Sum256(sum[:])
	}
	sink.Add(uint64(sum[0]))
	return wrapperspb.String("ok"), nil
}

// calibrate returns the sha256 rounds that take cost of CPU on this core:
// the best of 20 timings, so that a neighbour's burst does not make the
// work smaller.
func calibrate(cost time.Duration) int {
	var sum [32]byte
	best := time.Duration(1 << 62)
	const n = 20000
	for try := 0; try < 20; try++ {
		start := time.Now()
		for i := 0; i < n; i++ {
			sum = sha256.Sum256(sum[:])
		}
		best = min(best, time.Since(start))
	}
	sink.Add(uint64(sum[0]))
	return max(1, int(float64(n)*float64(cost)/float64(best)))
}

// serverMain runs one backend: GOMAXPROCS is set by the driver (1). rounds
// is the work per request, calibrated once by the driver so that every
// variant's backend does exactly the same work.
func serverMain(variant string, rounds int) error {
	if rounds < 1 {
		return fmt.Errorf("rounds must be at least 1, got %d", rounds)
	}
	b := &burner{rounds: rounds}
	opts, ctl, err := serverOptions(variant)
	if err != nil {
		return err
	}
	s := grpc.NewServer(opts...)
	s.RegisterService(&serviceDesc, b)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	admin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/stats", func(w http.ResponseWriter, r *http.Request) {
		m := map[string]any{
			"goroutines": runtime.NumGoroutine(),
			"rss_mb":     rssMB(),
			"rounds":     b.rounds,
		}
		if ctl != nil {
			st := ctl.Stats()
			m["limit"], m["executing"], m["queued"], m["pending"], m["service_ms"] = st.Limit, st.Executing, st.Queued, st.Pending, float64(st.ServiceTime)/1e6
			m["pending_cap"] = st.PendingCap
			m["rejected"] = benchObs.snapshot()
		}
		json.NewEncoder(w).Encode(m)
	})
	go http.Serve(admin, mux)
	if name := os.Getenv("TRIAGE_BENCH_TRACE"); name != "" && ctl != nil {
		if err := traceState(name, ctl); err != nil {
			return err
		}
	}
	if dir := os.Getenv("TRIAGE_BENCH_CPUPROFILE"); dir != "" { // experiment: the first 13 s (warm-up and one 10 s step)
		if err := profileFor(filepath.Join(dir, variant+".prof"), 13*time.Second); err != nil {
			return err
		}
	}
	fmt.Printf("LISTEN %s %s\n", lis.Addr(), admin.Addr())
	os.Stdout.Sync()
	return s.Serve(lis)
}

// traceState appends the controller's state to name every 100 ms (one
// JSON line each) until the process ends: the per-interval record of a run
// that enters a bad state, with the run-queue reading and the refusals
// the tap made (countingTap; the rest came later, in the interceptor).
func traceState(name string, ctl *admission.Controller) error {
	return statetrace.Start(name, 100*time.Millisecond, func() map[string]any {
		st := ctl.Stats()
		return map[string]any{
			"limit": st.Limit, "pending": st.Pending, "cap": st.PendingCap,
			"exec": st.Executing, "queued": st.Queued, "svc_ms": float64(st.ServiceTime) / 1e6,
			"delay_ms": float64(st.QueueDelay) / 1e6, "sat": st.Saturated, "busy": st.Busy,
			"paused_ms": float64(st.Paused) / 1e6, "probing": st.Probing, "notstarted": st.NotStarted,
			"runq_ms": float64(st.RunQueueWait) / 1e6, "queue_shed": st.QueueShed, "forced": st.Forced,
			"goroutines": runtime.NumGoroutine(), "rejected": benchObs.snapshot(), "tap_refused": tapRefused.Load(),
		}
	})
}

// profileFor writes a CPU profile of the next d to name.
func profileFor(name string, d time.Duration) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return err
	}
	time.AfterFunc(d, func() { pprof.StopCPUProfile(); f.Close() })
	return nil
}

// rssMB reads the process's peak resident set (measure.PeakRSS) in MB.
func rssMB() float64 {
	n, _ := measure.PeakRSS(0)
	return float64(n) / (1 << 20)
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return out
}

var errShed = status.Error(codes.Unavailable, "shed")

func serverOptions(variant string) ([]grpc.ServerOption, *admission.Controller, error) {
	switch variant {
	case "none":
		return nil, nil, nil
	case "procrustean":
		return []grpc.ServerOption{grpc.UnaryInterceptor(procrustean())}, nil, nil
	case "go-zero":
		shedder := load.NewAdaptiveShedder()
		return []grpc.ServerOption{grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			p, err := shedder.Allow()
			if err != nil {
				return nil, errShed
			}
			resp, err := h(ctx, req)
			if err != nil {
				p.Fail()
			} else {
				p.Pass()
			}
			return resp, err
		})}, nil, nil
	case "kratos-bbr":
		limiter := bbr.NewLimiter()
		return []grpc.ServerOption{grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			done, err := limiter.Allow()
			if err != nil {
				return nil, errShed
			}
			resp, err := h(ctx, req)
			done(ratelimit.DoneInfo{Err: err})
			return resp, err
		})}, nil, nil
	case "oracle-tap16":
		return oracleTap(16), nil, nil
	case "oracle-tap2":
		return oracleTap(2), nil, nil
	case "oracle-tap4":
		return oracleTap(4), nil, nil
	case "failsafe-go":
		return failsafeOptions(context.Background()), nil, nil
	case "failsafe-go-naive":
		return failsafeNaiveOptions(context.Background()), nil, nil
	case "triage-admission", "triage", "triage-no-retry-after":
		opts := append(admissionOptions(), admission.WithObserver(benchObs))
		if variant == "triage-no-retry-after" {
			opts = append(opts, admission.WithRetryAfter(0, 0))
		}
		ctl, err := admission.New(opts...)
		if err != nil {
			return nil, nil, err
		}
		sopts := []triagegrpc.ServerOption{triagegrpc.WithIntake(intake.WithAdmission(ctl),
			intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.0/8"}})))}
		if v, err := strconv.Atoi(os.Getenv("TRIAGE_BENCH_CONNSHARE")); err == nil {
			sopts = append(sopts, triagegrpc.WithIntake(intake.WithConnShare(v)))
		}
		srv, err := triagegrpc.NewServer(sopts...)
		if err != nil {
			return nil, nil, err
		}
		if os.Getenv("TRIAGE_BENCH_NOSTATS") == "1" { // the Server's options but its stats handler
			return []grpc.ServerOption{grpc.InTapHandle(srv.TapHandle()), grpc.ChainUnaryInterceptor(srv.UnaryInterceptor()),
				grpc.MaxConcurrentStreams(triagegrpc.DefaultMaxConcurrentStreams)}, ctl, nil
		}
		o := srv.ServerOptions()
		if os.Getenv("TRIAGE_BENCH_TRACE") != "" { // the trace counts the tap's own refusals
			o = append(countingTap(srv.TapHandle()), srv.ServerOptions()[1:]...) // ServerOptions' first is its tap
		}
		if v, err := strconv.Atoi(os.Getenv("TRIAGE_BENCH_STREAMS")); err == nil { // experiment: the per-connection stream bound
			o = append(o, grpc.MaxConcurrentStreams(uint32(v)))
		}
		return o, ctl, nil
	}
	return nil, nil, fmt.Errorf("unknown variant %q", variant)
}

// admissionOptions reads experiment knobs from the environment
// (TRIAGE_BENCH_TOLERANCE, TRIAGE_BENCH_QUEUE, TRIAGE_BENCH_MAXWAIT,
// TRIAGE_BENCH_TARGET, TRIAGE_BENCH_MEASURE=arrival, TRIAGE_BENCH_NOSAT=1
// for no work conservation; TRIAGE_BENCH_TRACE=FILE in serverMain; and
// TRIAGE_BENCH_NOSTATS=1, TRIAGE_BENCH_CONNSHARE in serverOptions;
// TRIAGE_BENCH_CPUPROFILE=DIR in serverMain writes DIR/VARIANT.prof, a CPU
// profile of the backend's first 13 s); the published numbers use none
// of them: the defaults are what users get.
func admissionOptions() []admission.Option {
	var opts []admission.Option
	if v, err := time.ParseDuration(os.Getenv("TRIAGE_BENCH_TARGET")); err == nil {
		opts = append(opts, admission.WithTargetDelay(v))
	}
	if os.Getenv("TRIAGE_BENCH_MEASURE") == "arrival" {
		opts = append(opts, admission.WithDelayMeasure(admission.ArrivalDelay))
	}
	if os.Getenv("TRIAGE_BENCH_NOSAT") == "1" {
		opts = append(opts, admission.WithSaturation(nil))
	}
	if v, err := strconv.ParseFloat(os.Getenv("TRIAGE_BENCH_TOLERANCE"), 64); err == nil {
		opts = append(opts, admission.WithTolerance(v))
	}
	if v, err := strconv.Atoi(os.Getenv("TRIAGE_BENCH_QUEUE")); err == nil {
		opts = append(opts, admission.WithQueueFactor(v))
	}
	if v, err := time.ParseDuration(os.Getenv("TRIAGE_BENCH_MAXWAIT")); err == nil {
		opts = append(opts, admission.WithMaxWait(v))
	}
	return opts
}

// procrustean is the CRE post's shedder: the load is the number of
// requests in progress; above a soft quota of 25 it rejects a growing share
// (n of every 10), everything at the hard quota of 45.
func procrustean() grpc.UnaryServerInterceptor {
	const hard, soft, steps = 45, 25, 10
	divisor := float64(hard-soft) / steps
	var inflight, modulus atomic.Int64
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		m := modulus.Add(1) % steps
		threshold := int64((hard - float64(inflight.Load())) / divisor)
		if m >= threshold {
			return nil, errShed
		}
		inflight.Add(1)
		defer inflight.Add(-1)
		return h(ctx, req)
	}
}

// oracleTap is the hand-tuned limit of issue 4's prototype: requests in
// flight counted from the tap handle (stream arrival) to the end of the
// stream, at most n.
func oracleTap(n int64) []grpc.ServerOption {
	var inflight atomic.Int64
	return []grpc.ServerOption{grpc.InTapHandle(func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if inflight.Add(1) > n {
			inflight.Add(-1)
			return nil, errShed
		}
		var once atomic.Bool
		release := func() {
			if once.CompareAndSwap(false, true) {
				inflight.Add(-1)
			}
		}
		context.AfterFunc(ctx, release)
		return context.WithValue(ctx, releaseKey{}, release), nil
	}), grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if f, ok := ctx.Value(releaseKey{}).(func()); ok {
			f()
		}
		return resp, err
	})}
}

type releaseKey struct{}

var errUsage = errors.New("usage")

// countingObserver counts rejections by criticality and reason, for the
// benchmark's diagnostics.
type countingObserver struct {
	rejected [4][admission.NumReasons]atomic.Int64
}

var benchObs = &countingObserver{}

// countingTap is tap, counting its refusals in tapRefused.
func countingTap(inTap tap.ServerInHandle) []grpc.ServerOption {
	return []grpc.ServerOption{grpc.InTapHandle(func(ctx context.Context, info *tap.Info) (context.Context, error) {
		c, err := inTap(ctx, info)
		if err != nil {
			tapRefused.Add(1)
		}
		return c, err
	})}
}

// tapRefused counts the requests triage's tap handle refused, before
// grpc-go gave them a goroutine (the rest of benchObs's refusals came
// later, in the interceptor).
var tapRefused atomic.Int64

func (o *countingObserver) Observe(e admission.Event) {
	if e.Kind == admission.Rejected && e.Level.Valid() && e.Reason < admission.NumReasons {
		o.rejected[e.Level][e.Reason].Add(1)
	}
}

func (o *countingObserver) snapshot() map[string]int64 {
	m := map[string]int64{}
	for l := range o.rejected {
		for r := range o.rejected[l] {
			if n := o.rejected[l][r].Load(); n > 0 {
				m[criticality.Level(l).String()+"/"+admission.Reason(r).String()] = n
			}
		}
	}
	return m
}
