package e2e

// Issue 10, part 3, over loopback sockets: optimistic and pessimistic
// throttling with the quota service on gRPC. Three tasks lease their share
// of one customer's hard limit from an Allocator served by
// quotaservice.Service, and enforce it on real gRPC calls. Each request
// declares its CPU (10 ms), so that the global usage in each 1 s window is
// exact: the sum of the costs the tasks admitted. The customer's demand
// surges to 3x its limit on two tasks, then moves to the third.

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/triagehq/triage/quota/allocate"
	"github.com/triagehq/triage/quota/usage"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagegrpc/quotaservice"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotapb"
)

const (
	modeLimit = 2.0                   // CPU-seconds per second, hard
	modeCost  = 10 * time.Millisecond // each request's CPU
)

type modeRun struct {
	mode    quota.Mode
	windows []float64 // CPU admitted in each 1 s window, over all tasks
	demand  []float64 // CPU offered
}

func runMode(t *testing.T, mode quota.Mode, scale float64) modeRun {
	t.Helper()
	sc := func(d time.Duration) time.Duration { return time.Duration(float64(d) * scale) }
	pol, err := quota.New(quota.Config{Tasks: 3, Fallback: quota.Safe, Customers: map[string]quota.Limit{"bulk": {CPU: modeLimit, Hard: true}}})
	if err != nil {
		t.Fatal(err)
	}
	alloc, err := allocate.New(pol, allocate.WithMode(mode), allocate.WithRefresh(500*time.Millisecond), allocate.WithLease(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	qs := grpc.NewServer()
	quotapb.RegisterQuotaServer(qs, quotaservice.NewService(alloc))
	qaddr := loopback.ServeGRPC(t, qs)
	qcc, err := grpc.NewClient("passthrough:///"+qaddr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		quotaservice.DialOptions(500*time.Millisecond)...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qcc.Close() })

	start := time.Now()
	end := sc(24 * time.Second)
	run := modeRun{mode: mode, windows: make([]float64, int(end/time.Second)+1), demand: make([]float64, int(end/time.Second)+1)}
	var mu sync.Mutex
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var conns []*grpc.ClientConn
	for i := range 3 {
		u, err := usage.New()
		if err != nil {
			t.Fatal(err)
		}
		leased := quota.NewLeased(nil, pol)
		enf, err := quota.NewEnforcer(leased, u, quota.WithMode(mode))
		if err != nil {
			t.Fatal(err)
		}
		qc, err := quotaservice.NewClient(qcc, fmt.Sprintf("task-%d", i), u, leased, quotaservice.WithRefresh(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if err := qc.RefreshOnce(ctx); err != nil {
			t.Fatal(err)
		}
		go qc.Run(ctx)
		s := grpc.NewServer()
		relay.RegisterFunc(s, func(ctx context.Context, _ string) (string, error) {
			r, err := enf.Reserve("bulk", criticality.Sheddable)
			if err != nil {
				return "", err
			}
			enf.Done("bulk", criticality.Sheddable, r, modeCost)
			if w := int(time.Since(start) / time.Second); w < len(run.windows) {
				mu.Lock()
				run.windows[w] += modeCost.Seconds()
				mu.Unlock()
			}
			return "ok", nil
		})
		conns = append(conns, plainConn(t, loopback.ServeGRPC(t, s)))
	}

	// Demand: 1 CPU-s/s spread over the three tasks (0.9 in whole
	// requests) for the first sixth;
	// 6 (3x the limit) on tasks 0 and 1 until half-time; 6 on task 2 until
	// the last sixth; then 1 spread again.
	perTask := func(el time.Duration, i int) float64 {
		switch {
		case el < end/6 || el >= end-end/6:
			return 1.0 / 3
		case el < end/2:
			if i < 2 {
				return 3
			}
		default:
			if i == 2 {
				return 6
			}
		}
		return 0
	}
	var load loopback.Schedule
	const step = 100 * time.Millisecond
	for at := time.Duration(0); at < end; at += step {
		for i := range 3 {
			n := perTask(at, i) * step.Seconds() / modeCost.Seconds()
			for k := range int(n + 0.5) {
				load = append(load, loopback.Shot{Key: fmt.Sprint(i), At: at + time.Duration(k)*step/time.Duration(max(1, int(n+0.5)))})
				run.demand[int(at/time.Second)] += modeCost.Seconds()
			}
		}
	}
	load.Run(func(_ time.Duration, s loopback.Shot) func() {
		cc := conns[s.Key[0]-'0']
		return func() {
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			relay.Invoke(rctx, cc, "x")
		}
	})
	run.windows = run.windows[:int(end/time.Second)]
	run.demand = run.demand[:int(end/time.Second)]
	return run
}

// Pessimistic: no 1 s window of global usage over the limit, ever;
// optimistic: over it while the measurement catches up, then at it.
func TestThrottlingModesOverLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time load over loopback")
	}
	alongside(t)
	scale := 0.5
	if os.Getenv("TRIAGE_MEASURE") == "1" {
		scale = 2.5 // 60 s per mode
	}
	// The two modes run at once, each on servers of its own: the same
	// machine's load for both.
	var mu sync.Mutex
	runs := map[quota.Mode]modeRun{}
	t.Run("modes", func(t *testing.T) {
		for _, m := range []quota.Mode{quota.ModeOptimistic, quota.ModePessimistic} {
			t.Run(m.String(), func(t *testing.T) {
				t.Parallel()
				r := runMode(t, m, scale)
				mu.Lock()
				runs[m] = r
				mu.Unlock()
			})
		}
	})
	if t.Failed() {
		return
	}
	for _, m := range []quota.Mode{quota.ModeOptimistic, quota.ModePessimistic} {
		r := runs[m]
		peak, over, unused, n := 0.0, 0, 0.0, 0
		line := ""
		for i, u := range r.windows {
			peak = max(peak, u)
			if u > modeLimit+1e-9 {
				over++
			}
			if i > 0 && r.demand[i] > 1.5*modeLimit && r.demand[i-1] > 1.5*modeLimit {
				unused += max(0, modeLimit-u) / modeLimit
				n++
			}
			line += fmt.Sprintf(" %.2f", u)
		}
		if n > 0 {
			unused /= float64(n)
		}
		t.Logf("%-11s peak 1 s window %.2f of the limit %.1f, %d of %d windows over, unused capacity while demand exceeds it %.1f%%; windows:%s",
			m, peak/modeLimit, modeLimit, over, len(r.windows), 100*unused, line)
		switch m {
		case quota.ModePessimistic:
			if over > 0 {
				t.Errorf("pessimistic: %d windows over the limit (peak %.3f CPU-s)", over, peak)
			}
		case quota.ModeOptimistic:
			if over == 0 {
				t.Errorf("optimistic: never over the limit (peak %.3f): the surge shows nothing", peak)
			}
		}
	}
}
