package batchproxy_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/triagehq/triage/triagegrpc/batchproxy"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
)

type proxied struct {
	backend *relay.Tier
	proxy   string // the proxy's address
	deadl   chan time.Duration
}

// startProxied serves a relay backend behind a Proxy, both on loopback.
// The backend trusts the proxy; the proxy trusts its callers when
// trustCallers is set. fail, if set, is the backend's answer.
func startProxied(t *testing.T, trustCallers bool, fail func(ctx context.Context) error) *proxied {
	t.Helper()
	pol := trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})
	callers := pol
	if !trustCallers {
		callers = trust.MustNew(trust.Config{})
	}
	p := &proxied{deadl: make(chan time.Duration, 16)}
	p.backend = &relay.Tier{Name: "backend", Fail: func(ctx context.Context, _ string) error {
		if d, ok := ctx.Deadline(); ok {
			select {
			case p.deadl <- time.Until(d):
			default:
			}
		}
		if fail != nil {
			return fail(ctx)
		}
		return nil
	}}
	bs, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(pol)))
	if err != nil {
		t.Fatal(err)
	}
	backend := grpc.NewServer(bs.ServerOptions()...)
	relay.Register(backend, p.backend)
	baddr := loopback.ServeGRPC(t, backend)

	cc := loopback.DialGRPC(t, baddr, loopback.Client(t, egress.WithoutPolicy()).DialOptions()...)
	px, err := batchproxy.New(cc)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(callers)))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(append(ps.ServerOptions(), px.ServerOptions()...)...)
	healthpb.RegisterHealthServer(srv, health.NewServer()) // the proxy's own service still works
	p.proxy = loopback.ServeGRPC(t, srv)
	return p
}

// The batch proxy forwards methods it does not know, unary and streaming,
// with criticality, attempt counter and deadline; its own services still
// answer; an unknown method's status comes back from the backend.
func TestProxyForwards(t *testing.T) {
	p := startProxied(t, true, nil)
	client := loopback.DialGRPC(t, p.proxy, loopback.Client(t, egress.WithoutPolicy()).DialOptions()...)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	ctx = criticality.NewContext(ctx, criticality.SheddablePlus)
	ctx = attempt.NewOutgoingContext(ctx, 2)
	got, err := relay.Invoke(ctx, client, "x")
	if err != nil {
		t.Fatal(err)
	}
	if got != "backend:SHEDDABLE_PLUS/2" {
		t.Errorf("unary through the proxy: backend saw %q, want SHEDDABLE_PLUS and attempt 2", got)
	}
	if d := <-p.deadl; d <= 0 || d > 3*time.Second {
		t.Errorf("backend's deadline %v away, want the caller's (under 3 s)", d)
	}
	got, err = relay.InvokeStream(criticality.NewContext(context.Background(), criticality.CriticalPlus), client, "y")
	if err != nil || got != "backend:CRITICAL_PLUS/0" {
		t.Errorf("stream through the proxy: %q, %v", got, err)
	}
	if r, err := healthpb.NewHealthClient(client).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("the proxy's own health service: %v, %v", r, err)
	}
	err = client.Invoke(ctx, "/no.Such/Method", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("unknown method: %v, want the backend's Unimplemented", err)
	}
}

// A caller the proxy does not trust cannot raise its criticality: its
// claim is stripped at the proxy, and the backend sees the proxy's own
// classification (the default, CRITICAL).
func TestProxyIgnoresUntrustedClaims(t *testing.T) {
	p := startProxied(t, false, nil)
	client := loopback.DialGRPC(t, p.proxy) // plain grpc-go, no triage interceptors
	ctx := metadata.AppendToOutgoingContext(context.Background(), "triage-criticality", "CRITICAL_PLUS", "triage-attempt", "2")
	got, err := relay.Invoke(ctx, client, "x")
	if err != nil {
		t.Fatal(err)
	}
	if got != "backend:CRITICAL/0" {
		t.Errorf("untrusted claim of CRITICAL_PLUS, attempt 2: backend saw %q, want CRITICAL/0", got)
	}
}

// A backend's overload rejection reaches the batch client as "overloaded;
// don't retry": only the proxy, directly above the backend, may retry.
func TestProxyOverloadGoesUpAsDontRetry(t *testing.T) {
	p := startProxied(t, true, func(context.Context) error {
		return triagegrpc.ToError(&outcome.Error{Kind: outcome.TaskOverloaded, Reason: "test"})
	})
	client := loopback.DialGRPC(t, p.proxy, loopback.Client(t, egress.WithoutPolicy()).DialOptions()...)
	_, err := relay.Invoke(context.Background(), client, "x")
	var oe *outcome.Error
	if !errors.As(err, &oe) || oe.Kind != outcome.DontRetry {
		t.Fatalf("got %v, want overloaded; don't retry", err)
	}
}

// BenchmarkProxy: one unary call after another on loopback, straight to
// the backend, through the batch proxy, and through a typed relay hop (a
// server whose handler calls the backend: what any extra gRPC hop costs),
// in the same run; p50-us is the median latency, so that the proxy's added
// latency is the difference of the medians (issue's target: at most
// 100 µs).
func BenchmarkProxy(b *testing.B) {
	for _, via := range []string{"direct", "proxy", "typed-hop"} {
		b.Run(via, func(b *testing.B) {
			pol := trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})
			bs, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(pol)))
			if err != nil {
				b.Fatal(err)
			}
			backend := grpc.NewServer(bs.ServerOptions()...)
			relay.Register(backend, &relay.Tier{Name: "backend"})
			addr := loopback.ServeGRPC(b, backend)
			if via == "proxy" {
				cc := loopback.DialGRPC(b, addr, loopback.Client(b, egress.WithoutPolicy()).DialOptions()...)
				px, err := batchproxy.New(cc)
				if err != nil {
					b.Fatal(err)
				}
				ps, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(pol)))
				if err != nil {
					b.Fatal(err)
				}
				addr = loopback.ServeGRPC(b, grpc.NewServer(append(ps.ServerOptions(), px.ServerOptions()...)...))
			}
			if via == "typed-hop" {
				cc := loopback.DialGRPC(b, addr, loopback.Client(b, egress.WithoutPolicy()).DialOptions()...)
				hs, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(pol)))
				if err != nil {
					b.Fatal(err)
				}
				hop := grpc.NewServer(hs.ServerOptions()...)
				relay.Register(hop, &relay.Tier{Name: "hop", Next: cc})
				addr = loopback.ServeGRPC(b, hop)
			}
			client := loopback.DialGRPC(b, addr, loopback.Client(b, egress.WithoutPolicy()).DialOptions()...)
			ctx := context.Background()
			if _, err := relay.Invoke(ctx, client, "warm"); err != nil {
				b.Fatal(err)
			}
			lat := make([]time.Duration, 0, min(b.N, 1<<20))
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				t0 := time.Now()
				if _, err := relay.Invoke(ctx, client, "x"); err != nil {
					b.Fatal(err)
				}
				if i < 1<<20 {
					lat = append(lat, time.Since(t0))
				}
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-us")
		})
	}
}

// The proxy's fuse holds for methods under the health service's name that
// the health service does not have (issue 21, item 5): with admission
// refusing everything, the proxy's own health Check still answers, while
// /grpc.health.v1.Health/Nope is refused by the proxy's admission and
// never reaches the backend.
func TestProxyHealthPrefixDoesNotPassTheFuse(t *testing.T) {
	var reached atomic.Int64
	bs, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}}))))
	if err != nil {
		t.Fatal(err)
	}
	backend := grpc.NewServer(append(bs.ServerOptions(), grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
		reached.Add(1)
		return nil
	}))...)
	cc := loopback.DialGRPC(t, loopback.ServeGRPC(t, backend), loopback.Client(t, egress.WithoutPolicy()).DialOptions()...)
	px, err := batchproxy.New(cc)
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := admission.New(admission.WithSignal(overloaded{}, admission.DefaultThresholds()))
	if err != nil {
		t.Fatal(err)
	}
	ps, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithAdmission(ctl)))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(append(ps.ServerOptions(), px.ServerOptions()...)...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	conn := loopback.DialGRPC(t, loopback.ServeGRPC(t, srv))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("the proxy's health Check under full shedding: %v, %v", r, err)
	}
	err = conn.Invoke(ctx, "/grpc.health.v1.Health/Nope", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
	if oe, ok := triagegrpc.FromStatus(status.Convert(err)); !ok || !oe.Kind.Overload() {
		t.Errorf("an unknown method under the health service's name: %v, want refused by the proxy's admission", err)
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("%d calls reached the backend", n)
	}
}

// overloaded is a utilization signal past every threshold.
type overloaded struct{}

func (overloaded) Name() string         { return "overloaded" }
func (overloaded) Utilization() float64 { return 2 }
