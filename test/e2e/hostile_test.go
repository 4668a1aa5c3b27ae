package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/triagehq/triage/quota/allocate"
	"github.com/triagehq/triage/quota/usage"

	"github.com/triagehq/triage/triagegrpc/batchproxy"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagegrpc/quotaservice"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotapb"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/trust"
)

// The hostile-peer suite (issue 21), with the conformance table's
// spelling rows (conformance_test.go), the slow senders
// (slowsender_test.go) and the fuzz tests: floods of distinct customers,
// client types and tasks, malformed protobuf. Each server runs in this
// process on loopback, so its heap is measured directly.

// dialFrom is a plaintext connection to addr from the loopback address
// src (whose trust the server decides), closed with the test.
func dialFrom(t *testing.T, src, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	d := loopback.Dialer(src, 5*time.Second)
	cc, err := grpc.NewClient("passthrough:///"+addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) })}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// heapAfterGC is the live heap, in bytes.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// floodBound is the most the live heap may grow under one flood: 10,000
// tracked customers' usage windows (about 1.5 KB each) and the transport's
// buffers, with room to spare.
const floodBound = 48 << 20

// A broken trusted peer (every request a new customer) and an untrusted
// one (every request a new customer and Host) send 30,000 requests each
// to a gRPC server and an HTTP server with quotas: the quota usage tracks
// at most its bound of customers (the untrusted caller's are nobody's:
// they count under Other), and the servers' live heap grows by less than
// floodBound.
func TestFloodsOfDistinctCustomersStayBounded(t *testing.T) {
	const n = 30000
	for _, transport := range []string{"gRPC", "HTTP"} {
		t.Run(transport, func(t *testing.T) {
			table, err := usage.New()
			if err != nil {
				t.Fatal(err)
			}
			p, _ := quota.New(quota.Config{Default: quota.Limit{CPU: 1000}})
			enf, err := quota.NewEnforcer(p, table)
			if err != nil {
				t.Fatal(err)
			}
			meter, err := cost.New()
			if err != nil {
				t.Fatal(err)
			}
			pol := trust.MustNew(trust.Config{Networks: []string{trustedIP + "/32"}})
			var served atomic.Int64
			var send func(src string, i int) error
			before := heapAfterGC()
			switch transport {
			case "gRPC":
				srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(pol), intake.WithQuota(enf, meter)))
				if err != nil {
					t.Fatal(err)
				}
				gs := grpc.NewServer(append(srv.ServerOptions(), grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
					var in emptypb.Empty
					if err := ss.RecvMsg(&in); err != nil {
						return err
					}
					served.Add(1)
					return ss.SendMsg(&emptypb.Empty{})
				}))...)
				lis, err := net.Listen("tcp", trustedIP+":0")
				if err != nil {
					t.Fatal(err)
				}
				go gs.Serve(lis)
				t.Cleanup(gs.Stop)
				conns := map[string]*grpc.ClientConn{trustedIP: dialFrom(t, trustedIP, lis.Addr().String()), untrustedIP: dialFrom(t, untrustedIP, lis.Addr().String())}
				send = func(src string, i int) error {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					ctx = metadata.AppendToOutgoingContext(ctx, "triage-customer", fmt.Sprintf("customer-%d", i), "triage-criticality", "CRITICAL_PLUS")
					return conns[src].Invoke(ctx, "/flood.Svc/Call", &emptypb.Empty{}, &emptypb.Empty{})
				}
			case "HTTP":
				mw, err := triagehttp.Middleware(triagehttp.WithIntake(intake.WithTrust(pol), intake.WithQuota(enf, meter)))
				if err != nil {
					t.Fatal(err)
				}
				lis, err := net.Listen("tcp", trustedIP+":0")
				if err != nil {
					t.Fatal(err)
				}
				hs := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1) }))}
				go hs.Serve(lis)
				t.Cleanup(func() { hs.Close() })
				clients := map[string]*http.Client{trustedIP: loopback.HTTPClient(trustedIP, 10*time.Second), untrustedIP: loopback.HTTPClient(untrustedIP, 10*time.Second)}
				send = func(src string, i int) error {
					req, _ := http.NewRequest("GET", "http://"+lis.Addr().String()+"/flood", nil)
					req.Host = fmt.Sprintf("client-%d.example", i) // a new client type every request
					req.Header.Set("Triage-Customer", fmt.Sprintf("customer-%d", i))
					req.Header.Set("Triage-Criticality", "CRITICAL_PLUS")
					resp, err := clients[src].Do(req)
					if err != nil {
						return err
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						return fmt.Errorf("HTTP %d", resp.StatusCode)
					}
					return nil
				}
			}
			var wg sync.WaitGroup
			var next atomic.Int64
			var failed atomic.Int64
			for w := 0; w < 8; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := int(next.Add(1)); i <= 2*n; i = int(next.Add(1)) {
						src := trustedIP
						if i%2 == 0 {
							src = untrustedIP
						}
						if err := send(src, i); err != nil && failed.Add(1) == 1 {
							t.Errorf("request %d from %s: %v", i, src, err)
						}
					}
				}()
			}
			wg.Wait()
			grown := int64(heapAfterGC()) - int64(before)
			snap := table.Snapshot()
			other := false
			for _, c := range snap {
				other = other || c.Customer == quota.Other
			}
			t.Logf("%s: %d requests served, %d customers reported (Other among them: %v), live heap grew %.1f MiB (bound %d MiB)",
				transport, served.Load(), len(snap), other, float64(grown)/(1<<20), floodBound>>20)
			if served.Load() != 2*n {
				t.Errorf("served %d of %d", served.Load(), 2*n)
			}
			if len(snap) > quota.MaxReportCustomers || !other {
				t.Errorf("%d customers tracked (bound %d); untrusted requests under Other: %v", len(snap), quota.MaxReportCustomers, other)
			}
			if grown > floodBound {
				t.Errorf("live heap grew %d bytes under the flood, bound %d", grown, floodBound)
			}
		})
	}
}

// rawCodec sends bytes as they are, for malformed protobuf.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) ([]byte, error) {
	return *(v.(*[]byte)), nil
}
func (rawCodec) Unmarshal(b []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), b...)
	return nil
}

var _ encoding.Codec = rawCodec{}

// The quota service under malformed and truncated protobuf, and a flood
// of made-up task ids from a caller nobody authenticated: every malformed
// message is refused (INVALID_ARGUMENT or INTERNAL), nothing panics, the
// task slots fill to their bound and no further (RESOURCE_EXHAUSTED), and
// the service's live heap grows by less than floodBound.
func TestQuotaServiceUnderHostileCallers(t *testing.T) {
	p, _ := quota.New(quota.Config{Tasks: 3, Customers: map[string]quota.Limit{"ads": {CPU: 4}}})
	const maxTasks = 2000
	a, err := allocate.New(p, allocate.WithMaxTasks(maxTasks))
	if err != nil {
		t.Fatal(err)
	}
	before := heapAfterGC()
	gs := grpc.NewServer(quotaservice.ServerOptions()...)
	quotapb.RegisterQuotaServer(gs, quotaservice.NewService(a))
	cc := loopback.DialGRPC(t, loopback.ServeGRPC(t, gs), quotaservice.DialOptions(time.Second)...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	good := (&quotapb.RefreshRequest{Task: "real-task", Customers: []*quotapb.CustomerUsage{{Customer: "ads", Used: []float64{0, 0, 1, 0}, Demand: 1}}}).Marshal()
	malformed := [][]byte{
		good[:len(good)/2], // truncated
		{0x0a, 0x80},       // length past the end
		{0x0a, 0x02, 0xff, 0xfe},
		append([]byte{0x12, 0x0a}, []byte("\x12\x08\x00\x00\x00\x00\x00\x00\xf8\x7f")...), // NaN usage
		{0x12, 0x00, 0x12, 0x00}, // customers without names
		{0xff, 0xff, 0xff, 0xff, 0x0f},
	}
	for i, b := range malformed {
		var out []byte
		err := cc.Invoke(ctx, quotapb.RefreshMethod, &b, &out, grpc.ForceCodec(rawCodec{}))
		if c := status.Code(err); c != codes.InvalidArgument && c != codes.Internal {
			t.Errorf("malformed message %d: %v", i, err)
		}
	}
	qc := quotapb.NewQuotaClient(cc)
	exhausted := 0
	for i := range maxTasks + 500 {
		_, err := qc.Refresh(ctx, &quotapb.RefreshRequest{Task: fmt.Sprintf("made-up-%d", i), Customers: []*quotapb.CustomerUsage{{Customer: fmt.Sprintf("c%d", i), Demand: 1, Share: 1}}})
		if status.Code(err) == codes.ResourceExhausted {
			exhausted++
		} else if err != nil {
			t.Fatalf("task %d: %v", i, err)
		}
	}
	var out []byte
	err = cc.Invoke(ctx, quotapb.RefreshMethod, &good, &out, grpc.ForceCodec(rawCodec{}))
	grown := int64(heapAfterGC()) - int64(before)
	t.Logf("quota service: %d malformed messages refused, %d of %d made-up tasks refused at the bound of %d, live heap grew %.1f MiB",
		len(malformed), exhausted, maxTasks+500, maxTasks, float64(grown)/(1<<20))
	if exhausted != 500 {
		t.Errorf("%d made-up tasks refused, want the 500 past the bound", exhausted)
	}
	// Without authentication the made-up tasks hold the slots until their
	// lease runs out: a real task is refused meanwhile. With
	// WithTaskIdentities (TestQuotaServiceAuthenticatesTasks) the flood
	// cannot happen.
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("the real task after the flood: %v, want RESOURCE_EXHAUSTED", err)
	}
	if grown > floodBound {
		t.Errorf("live heap grew %d bytes, bound %d", grown, floodBound)
	}
}

// The batch proxy under a flood of 20,000 calls, each to a method name
// of its own and for a customer of its own, from a trusted and an
// untrusted caller: every call is forwarded and answered, and the live
// heap of the proxy and its backend together grows by less than
// floodBound.
func TestProxyFloodStaysBounded(t *testing.T) {
	const n = 10000
	var reached atomic.Int64
	bs, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{internalIP + "/32"}}))))
	if err != nil {
		t.Fatal(err)
	}
	backend := grpc.NewServer(append(bs.ServerOptions(), grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		var in emptypb.Empty
		if err := ss.RecvMsg(&in); err != nil {
			return err
		}
		reached.Add(1)
		return ss.SendMsg(&emptypb.Empty{})
	}))...)
	cc := loopback.DialGRPC(t, loopback.ServeGRPC(t, backend), loopback.Client(t, egress.WithoutPolicy()).DialOptions()...)
	px, err := batchproxy.New(cc)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTrust(trust.MustNew(trust.Config{Networks: []string{trustedIP + "/32"}}))))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(append(ps.ServerOptions(), px.ServerOptions()...)...)
	lis, err := net.Listen("tcp", trustedIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conns := map[string]*grpc.ClientConn{trustedIP: dialFrom(t, trustedIP, lis.Addr().String()), untrustedIP: dialFrom(t, untrustedIP, lis.Addr().String())}
	before := heapAfterGC()
	var wg sync.WaitGroup
	var next, failed atomic.Int64
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)); i <= 2*n; i = int(next.Add(1)) {
				src := trustedIP
				if i%2 == 0 {
					src = untrustedIP
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				ctx = metadata.AppendToOutgoingContext(ctx, "triage-customer", fmt.Sprintf("customer-%d", i))
				err := conns[src].Invoke(ctx, fmt.Sprintf("/flood.Svc%d/Method%d", i%1000, i), &emptypb.Empty{}, &emptypb.Empty{})
				cancel()
				if err != nil && failed.Add(1) == 1 {
					t.Errorf("call %d: %v", i, err)
				}
			}
		}()
	}
	wg.Wait()
	grown := int64(heapAfterGC()) - int64(before)
	t.Logf("proxy: %d calls forwarded, live heap of proxy and backend grew %.1f MiB (bound %d MiB)", reached.Load(), float64(grown)/(1<<20), floodBound>>20)
	if reached.Load() != 2*n {
		t.Errorf("%d of %d calls reached the backend", reached.Load(), 2*n)
	}
	if grown > floodBound {
		t.Errorf("live heap grew %d bytes, bound %d", grown, floodBound)
	}
}
