package e2e

// Issue 3 on real sockets: triage clients (throttling, retries, budgets)
// against a gRPC backend over loopback that accepts at most C requests per
// second. Time is virtual (one fake clock shared by the backend's limiter
// and the clients' windows) so that the book's two-minute statistics take
// milliseconds, while every sent attempt is a real RPC.

import (
	"context"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/throttle"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

// limitedBackend serves at most capacity calls per virtual second and
// answers the rest "task overloaded"; capacity 0 rejects everything.
type limitedBackend struct {
	clock    clock.Clock
	mu       sync.Mutex
	capacity int
	sec      int64
	used     int
	accepted int
	rejected int
	attempts [3]int // by attempt counter received
}

func (b *limitedBackend) fail(ctx context.Context, _ string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.clock.Now().Unix(); s != b.sec {
		b.sec, b.used = s, 0
	}
	n := attempt.Incoming(ctx)
	b.attempts[n]++
	if b.used >= b.capacity {
		b.rejected++
		return outcome.New(outcome.TaskOverloaded, "over capacity")
	}
	b.used++
	b.accepted++
	return nil
}

func startLimited(t *testing.T, b *limitedBackend) string { return serveB(t, b.fail) }

// serveB starts tier B on loopback, trusting 127.0.0.1, with fail as its
// Fail hook and extra triagegrpc options; it stops with the test.
func serveB(t *testing.T, fail func(context.Context, string) error, extra ...triagegrpc.ServerOption) string {
	t.Helper()
	opts := append([]triagegrpc.ServerOption{triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})))}, extra...)
	srv, err := triagegrpc.NewServer(opts...)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(srv.ServerOptions()...)
	relay.Register(s, &relay.Tier{Name: "B", Fail: fail, Observe: func(relay.Arrival) {}})
	return loopback.ServeGRPC(t, s)
}

func dialWith(t *testing.T, addr string, p *retry.Policy) *grpc.ClientConn {
	t.Helper()
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
		return dialerFrom(internalIP).DialContext(ctx, "tcp", a)
	})}, loopback.Client(t, egress.WithPolicy(p)).DialOptions()...)
	cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// offer sends rate requests per virtual second for d, round robin over the
// connections, one at a time.
func offer(t *testing.T, f *clock.Fake, ccs []*grpc.ClientConn, rate int, d time.Duration) {
	t.Helper()
	step := time.Second / time.Duration(rate)
	start := f.Now()
	ctx := criticality.NewContext(context.Background(), criticality.Critical)
	for i := 0; time.Duration(i)*step < d; i++ {
		f.Set(start.Add(time.Duration(i) * step))
		relay.Invoke(ctx, ccs[i%len(ccs)], "x")
	}
	f.Set(start.Add(d))
}

func TestLoopbackThrottlingEquilibrium(t *testing.T) {
	alongside(t)
	const capacity = 50
	for _, tc := range []struct {
		k        float64
		min, max float64
	}{{2, 0.8, 1.2}, {1.1, 0.05, 0.15}} {
		f := clock.NewFake(time.Now())
		b := &limitedBackend{clock: f, capacity: capacity}
		addr := startLimited(t, b)
		var ccs []*grpc.ClientConn
		for i := 0; i < 2; i++ {
			rng := rand.New(rand.NewPCG(5, uint64(i)))
			th, err := throttle.New(throttle.WithK(tc.k), throttle.WithClock(f), throttle.WithRandom(rng.Float64))
			if err != nil {
				t.Fatal(err)
			}
			p, err := retry.New(retry.WithClock(f), retry.WithRandom(rng.Float64), retry.WithBackoff(0, 0), retry.WithThrottle(th))
			if err != nil {
				t.Fatal(err)
			}
			ccs = append(ccs, dialWith(t, addr, p))
		}
		offer(t, f, ccs, 10*capacity, time.Minute)
		b.mu.Lock()
		acc0, rej0 := b.accepted, b.rejected
		b.mu.Unlock()
		offer(t, f, ccs, 10*capacity, 2*time.Minute)
		acc, rej := b.accepted-acc0, b.rejected-rej0
		ratio := float64(rej) / float64(acc)
		t.Logf("K=%v over loopback gRPC: backend accepted %d, rejected %d: %.3f per accept", tc.k, acc, rej, ratio)
		if ratio < tc.min || ratio > tc.max {
			t.Errorf("K=%v: rejected/accepted = %.3f, want in [%v, %v]", tc.k, ratio, tc.min, tc.max)
		}
	}
}

func TestLoopbackRetryGrowth(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     []retry.Option
		min, max float64
	}{
		{"budget", nil, 1.0, 1.12},
		{"no budget", []retry.Option{retry.WithoutBudget()}, 2.7, 3.0},
	} {
		f := clock.NewFake(time.Now())
		b := &limitedBackend{clock: f, capacity: 0}
		addr := startLimited(t, b)
		var ccs []*grpc.ClientConn
		for i := 0; i < 2; i++ {
			p, err := retry.New(append([]retry.Option{retry.WithClock(f), retry.WithBackoff(0, 0), retry.WithoutThrottle()}, tc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			ccs = append(ccs, dialWith(t, addr, p))
		}
		const requests = 1000
		offer(t, f, ccs, 20, requests*time.Second/20)
		growth := float64(b.rejected) / requests
		t.Logf("%s over loopback gRPC: %d requests, %d attempts (by attempt counter %v): %.3fx", tc.name, requests, b.rejected, b.attempts, growth)
		if growth < tc.min || growth > tc.max {
			t.Errorf("%s: attempts/requests = %.3f, want in [%v, %v]", tc.name, growth, tc.min, tc.max)
		}
		if b.attempts[1] == 0 {
			t.Errorf("%s: no attempt arrived with counter 1", tc.name)
		}
	}
}
