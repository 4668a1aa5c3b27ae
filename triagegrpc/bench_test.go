package triagegrpc_test

import (
	"context"
	"crypto/sha256"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/relay"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/quota/usage"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/trust"
	"github.com/triagehq/triage/wire"
)

// BenchmarkEncode is the client's encode step: the interceptor (without a
// Policy) adding the triage headers of the call's context to its outgoing
// metadata, invoking a no-op invoker. /retry is a retry attempt (two
// headers), /first a first attempt (criticality only).
func BenchmarkEncode(b *testing.B) {
	icpt := loopback.Client(b, egress.WithoutPolicy(), egress.WithInternal("*")).UnaryInterceptor()
	var got metadata.MD
	noop := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		got, _ = metadata.FromOutgoingContext(ctx)
		return nil
	}
	nop := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		return nil
	}
	base := criticality.NewContext(context.Background(), criticality.SheddablePlus)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want int
	}{{"first", base, 1}, {"retry", attempt.NewOutgoingContext(base, 1), 2}} {
		_ = icpt(tc.ctx, "/s/M", nil, nil, nil, noop)
		if len(got) != tc.want || got.Get(wire.CriticalityKey)[0] != "SHEDDABLE_PLUS" {
			b.Fatalf("%s: encoded %v", tc.name, got)
		}
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = icpt(tc.ctx, "/s/M", nil, nil, nil, nop)
			}
		})
	}
}

// BenchmarkDecode is the server's decode step in the tap handle for a
// trusted peer: parse criticality and attempt from the raw metadata,
// classify, put them in the context.
func BenchmarkDecode(b *testing.B) {
	srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}}))))
	if err != nil {
		b.Fatal(err)
	}
	th := srv.TapHandle()
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5}})
	for _, tc := range []struct {
		name    string
		attempt string
	}{{"attempt=0", "0"}, {"attempt=2", "2"}} {
		info := &tap.Info{FullMethodName: "/s/M", Header: metadata.Pairs(wire.CriticalityKey, "SHEDDABLE", wire.AttemptKey, tc.attempt, ":authority", "svc")}
		out, _ := th(ctx, info)
		if criticality.Of(out) != criticality.Sheddable || attempt.Format(attempt.Incoming(out)) != tc.attempt {
			b.Fatalf("decoded %v/%d", criticality.Of(out), attempt.Incoming(out))
		}
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = th(ctx, info)
			}
		})
	}
}

// BenchmarkUnaryLoopback compares a real unary call over loopback with and
// without triage on both ends, in the same run.
func BenchmarkUnaryLoopback(b *testing.B) {
	for _, withTriage := range []bool{false, true} {
		name := "bare"
		if withTriage {
			name = "triage"
		}
		b.Run(name, func(b *testing.B) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			var sopts []grpc.ServerOption
			dopts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
			if withTriage {
				srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}}))))
				if err != nil {
					b.Fatal(err)
				}
				sopts = srv.ServerOptions()
				dopts = append(dopts, loopback.Client(b).DialOptions()...)
			}
			s := grpc.NewServer(sopts...)
			relay.Register(s, &relay.Tier{Name: "B"})
			go s.Serve(lis)
			defer s.Stop()
			cc, err := grpc.NewClient(lis.Addr().String(), dopts...)
			if err != nil {
				b.Fatal(err)
			}
			defer cc.Close()
			ctx := criticality.NewContext(context.Background(), criticality.SheddablePlus)
			want := "B:CRITICAL/0"
			if withTriage {
				want = "B:SHEDDABLE_PLUS/0"
			}
			if got, err := relay.Invoke(ctx, cc, "x"); err != nil || got != want {
				b.Fatalf("got %q, %v", got, err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := relay.Invoke(ctx, cc, "x"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkClientChainOverhead measures what the whole client side (header
// source, interceptor, throttle, retry policy, budget) adds to a unary call
// over loopback. The same bare server answers two connections, one bare and
// one with a Client's DialOptions(); each iteration makes one
// call on each, alternating, so drift and noise hit both alike. Reported:
// bare-ns/call, triage-ns/call and overhead-% (triage/bare - 1).
func BenchmarkClientChainOverhead(b *testing.B) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	s := grpc.NewServer()
	relay.Register(s, &relay.Tier{Name: "B"})
	go s.Serve(lis)
	defer s.Stop()
	dial := func(extra ...grpc.DialOption) *grpc.ClientConn {
		cc, err := grpc.NewClient(lis.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, extra...)...)
		if err != nil {
			b.Fatal(err)
		}
		return cc
	}
	bare, tri := dial(), dial(loopback.Client(b).DialOptions()...)
	defer bare.Close()
	defer tri.Close()
	ctx := criticality.NewContext(context.Background(), criticality.SheddablePlus)
	for _, cc := range []*grpc.ClientConn{bare, tri} {
		for i := 0; i < 100; i++ { // warm both connections
			if _, err := relay.Invoke(ctx, cc, "x"); err != nil {
				b.Fatal(err)
			}
		}
	}
	var tBare, tTri time.Duration
	n := 0
	for b.Loop() {
		first, second := bare, tri
		if n%2 == 1 {
			first, second = tri, bare
		}
		t0 := time.Now()
		if _, err := relay.Invoke(ctx, first, "x"); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := relay.Invoke(ctx, second, "x"); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if first == bare {
			tBare, tTri = tBare+t1.Sub(t0), tTri+t2.Sub(t1)
		} else {
			tTri, tBare = tTri+t1.Sub(t0), tBare+t2.Sub(t1)
		}
		n++
	}
	b.ReportMetric(float64(tBare.Nanoseconds())/float64(n), "bare-ns/call")
	b.ReportMetric(float64(tTri.Nanoseconds())/float64(n), "triage-ns/call")
	b.ReportMetric(100*(float64(tTri)/float64(tBare)-1), "overhead-%")
}

// BenchmarkServerStack measures what the server side adds to an empty
// loopback unary call: the same plain client calls a bare server, a server
// with triage's tap handle and interceptors, one with admission control
// too, and one with quotas (a customer within its quota on a task that is
// not overloaded: the enforcer's check, the CPU measurement and the usage
// charge). Compare ns/op, allocs/op and B/op between the sub-benchmarks.
func BenchmarkServerStack(b *testing.B) {
	for _, variant := range []string{"bare", "triage", "triage+admission", "triage+quota"} {
		b.Run(variant, func(b *testing.B) {
			var sopts []grpc.ServerOption
			if variant != "bare" {
				opts := []triagegrpc.ServerOption{triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})))}
				if variant == "triage+admission" {
					ctl, err := admission.New()
					if err != nil {
						b.Fatal(err)
					}
					opts = append(opts, triagegrpc.WithIntake(intake.WithAdmission(ctl)))
				}
				if variant == "triage+quota" {
					opts = append(opts, benchQuota(b))
				}
				srv, err := triagegrpc.NewServer(opts...)
				if err != nil {
					b.Fatal(err)
				}
				sopts = srv.ServerOptions()
			}
			s := grpc.NewServer(sopts...)
			s.RegisterService(&emptyDesc, struct{}{})
			cc := loopback.DialGRPC(b, loopback.ServeGRPC(b, s))
			ctx := context.Background()
			in, out := &emptypb.Empty{}, &emptypb.Empty{}
			if err := cc.Invoke(ctx, "/triage.bench.Empty/Call", in, out); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := cc.Invoke(ctx, "/triage.bench.Empty/Call", in, out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// emptyDesc is a service with one unary method that does nothing, so that
// BenchmarkServerStack measures the stack and not a handler.
var emptyDesc = grpc.ServiceDesc{
	ServiceName: "triage.bench.Empty",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Call",
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(emptypb.Empty)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) { return req, nil }
			if icpt == nil {
				return h(ctx, in)
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/triage.bench.Empty/Call"}, h)
		},
	}},
}

// BenchmarkServerStreamMessage measures what the server side adds to each
// message of a bidirectional stream over loopback (one message each way:
// the client's Send and Recv, the handler's RecvMsg and SendMsg): a bare
// server against one with triage and admission control, whose handler's
// every RecvMsg and SendMsg tells the request whether it waits on its
// client (intake.Handle.ClientWait). Compare ns/op and allocs/op.
func BenchmarkServerStreamMessage(b *testing.B) {
	for _, variant := range []string{"bare", "triage+admission"} {
		b.Run(variant, func(b *testing.B) {
			var sopts []grpc.ServerOption
			if variant != "bare" {
				ctl, err := admission.New()
				if err != nil {
					b.Fatal(err)
				}
				srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})), intake.WithAdmission(ctl)))
				if err != nil {
					b.Fatal(err)
				}
				sopts = srv.ServerOptions()
			}
			s := grpc.NewServer(sopts...)
			s.RegisterService(&echoDesc, struct{}{})
			cc := loopback.DialGRPC(b, loopback.ServeGRPC(b, s))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			st, err := cc.NewStream(ctx, &echoDesc.Streams[0], "/triage.bench.Echo/Echo")
			if err != nil {
				b.Fatal(err)
			}
			in, out := &emptypb.Empty{}, &emptypb.Empty{}
			b.ReportAllocs()
			for b.Loop() {
				if err := st.SendMsg(in); err != nil {
					b.Fatal(err)
				}
				if err := st.RecvMsg(out); err != nil {
					b.Fatal(err)
				}
			}
			st.CloseSend()
			if err := st.RecvMsg(out); err != io.EOF {
				b.Fatalf("end of stream: %v", err)
			}
		})
	}
}

// echoDesc is a service with one bidirectional method that echoes each
// message.
var echoDesc = grpc.ServiceDesc{
	ServiceName: "triage.bench.Echo",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName: "Echo", ServerStreams: true, ClientStreams: true,
		Handler: func(_ any, st grpc.ServerStream) error {
			m := new(emptypb.Empty)
			for {
				if err := st.RecvMsg(m); err == io.EOF {
					return nil
				} else if err != nil {
					return err
				}
				if err := st.SendMsg(m); err != nil {
					return err
				}
			}
		},
	}},
}

// BenchmarkRejectAtTap is a unary call over loopback that the server's tap
// handle rejects, decoded by the client, with the outcome in compact form
// (code and message, what triagegrpc's admission sends) against the same
// outcome with ErrorInfo details (what handlers send). Client and server
// share the process, so ns/op is both sides' CPU.
func BenchmarkRejectAtTap(b *testing.B) {
	e := &outcome.Error{Kind: outcome.TaskOverloaded, Reason: "concurrency"}
	for _, form := range []struct {
		name string
		err  error
	}{
		{"compact", status.Error(triagegrpc.Code(e.Kind), e.Error())},
		{"details", triagegrpc.Status(e).Err()},
	} {
		b.Run(form.name, func(b *testing.B) {
			s := grpc.NewServer(grpc.InTapHandle(func(ctx context.Context, _ *tap.Info) (context.Context, error) { return ctx, form.err }))
			relay.Register(s, &relay.Tier{Name: "B"})
			cc := loopback.DialGRPC(b, loopback.ServeGRPC(b, s))
			b.ReportAllocs()
			for b.Loop() {
				_, err := relay.Invoke(context.Background(), cc, "x")
				if oe, ok := triagegrpc.FromStatus(status.Convert(err)); !ok || oe.Reason != "concurrency" {
					b.Fatalf("%v decoded as %v", err, oe)
				}
			}
		})
	}
}

// BenchmarkTapRefusal is triage's decision at the tap for a request it
// refuses, without the transport: what a refusal adds to grpc-go's own
// cost of reading the stream's headers and writing its status (about
// 12 µs of server CPU a refusal, docs/rationale.md). A tap that only
// counts requests in flight measures about 13 ns here.
func BenchmarkTapRefusal(b *testing.B) {
	h, ctx, info := fullTap(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h(ctx, info); err == nil {
			b.Fatal("admitted by a full controller")
		}
	}
}

// BenchmarkQuotaOverhead: what quotas cost a server whose requests do
// real work, the 1x class of the cost accuracy test (200 SHA-256 rounds,
// about 17 µs): the same loopback server with triage's interceptors, and
// with quotas too (the enforcer's check, the CPU measurement, the usage
// charge). Client and server share the process; run with -cpu 1 and
// compare the medians of repeats: quota/plain - 1 is the overhead.
func BenchmarkQuotaOverhead(b *testing.B) {
	burn := func() {
		var h [32]byte
		for range 200 {
			h = sha256.Sum256(h[:])
		}
		benchSink = h[0]
	}
	for _, variant := range []string{"plain", "quota"} {
		b.Run(variant, func(b *testing.B) {
			opts := []triagegrpc.ServerOption{triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})))}
			if variant == "quota" {
				opts = append(opts, benchQuota(b))
			}
			srv, err := triagegrpc.NewServer(opts...)
			if err != nil {
				b.Fatal(err)
			}
			s := grpc.NewServer(srv.ServerOptions()...)
			desc := emptyDesc
			desc.ServiceName = "triage.bench.Burn"
			desc.Methods = []grpc.MethodDesc{{
				MethodName: "Call",
				Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
					in := new(emptypb.Empty)
					if err := dec(in); err != nil {
						return nil, err
					}
					h := func(ctx context.Context, req any) (any, error) { burn(); return req, nil }
					return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/triage.bench.Burn/Call"}, h)
				},
			}}
			s.RegisterService(&desc, struct{}{})
			cc := loopback.DialGRPC(b, loopback.ServeGRPC(b, s))
			ctx := quota.NewContext(context.Background(), "ads")
			in, out := &emptypb.Empty{}, &emptypb.Empty{}
			b.ReportAllocs()
			for b.Loop() {
				if err := cc.Invoke(ctx, "/triage.bench.Burn/Call", in, out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

var benchSink byte

// benchQuota is WithQuota for a customer within its quota on a task that
// is not overloaded: the check, the CPU measurement and the usage charge
// run, nothing is refused.
func benchQuota(b *testing.B) triagegrpc.ServerOption {
	p, _ := quota.New(quota.Config{Default: quota.Limit{CPU: 1}})
	u, _ := usage.New()
	e, _ := quota.NewEnforcer(p, u, quota.WithCapacity(64))
	m, err := cost.New()
	if err != nil {
		b.Fatal(err)
	}
	return triagegrpc.WithIntake(intake.WithQuota(e, m))
}
