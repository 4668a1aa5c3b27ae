package e2e

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/conformance"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagehttp"
)

// The conformance table (internal/testkit/conformance) over loopback to a
// gRPC server and to an HTTP server configured alike (conformance.Setup):
// the two must treat every row identically, as the table says.

func TestConformanceGRPCAndHTTP(t *testing.T) {
	grpcCall := conformanceGRPC(t)
	httpCall := conformanceHTTP(t)
	for _, row := range conformance.Rows {
		t.Run(row.Name, func(t *testing.T) {
			g, h := grpcCall(t, row), httpCall(t, row)
			t.Logf("gRPC: %v | HTTP: %v", g, h)
			if g.String() != row.Want.String() {
				t.Errorf("gRPC: %v\n want %v", g, row.Want)
			}
			if h.String() != row.Want.String() {
				t.Errorf("HTTP: %v\n want %v", h, row.Want)
			}
		})
	}
}

func conformanceGRPC(t *testing.T) func(*testing.T, conformance.Row) conformance.Seen {
	opts, ctl := conformance.Setup(t, trustedIP)
	srv, err := triagegrpc.NewServer(triagegrpc.WithIntake(append(opts, intake.WithAdmission(ctl))...),
		triagegrpc.WithGroup(func(_ context.Context, md metadata.MD) string {
			if v := md.Get("x-plan"); len(v) == 1 {
				return v[0]
			}
			return ""
		}))
	if err != nil {
		t.Fatal(err)
	}
	var rec conformance.Recorder
	gs := grpc.NewServer(append(srv.ServerOptions(), grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		var in emptypb.Empty
		if err := ss.RecvMsg(&in); err != nil {
			return err
		}
		md, _ := metadata.FromIncomingContext(ss.Context())
		var keys []string
		for k := range md {
			keys = append(keys, k)
		}
		rec.Record(ss.Context(), keys)
		return ss.SendMsg(&emptypb.Empty{})
	}))...)
	lis, err := net.Listen("tcp", trustedIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return grpcCaller(t, lis.Addr().String(), &rec)
}

func conformanceHTTP(t *testing.T) func(*testing.T, conformance.Row) conformance.Seen {
	opts, ctl := conformance.Setup(t, trustedIP)
	mw, err := triagehttp.Middleware(triagehttp.WithIntake(opts...), triagehttp.WithAdmission(ctl),
		triagehttp.WithHealthCheck("/grpc.health.v1.Health/Check"),
		triagehttp.WithGroup(func(r *http.Request) string { return r.Header.Get("X-Plan") }))
	if err != nil {
		t.Fatal(err)
	}
	var rec conformance.Recorder
	hs := &http.Server{Handler: mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var keys []string
		for k := range r.Header {
			keys = append(keys, k)
		}
		rec.Record(r.Context(), keys)
	}))}
	lis, err := net.Listen("tcp", trustedIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	go hs.Serve(lis)
	t.Cleanup(func() { hs.Close() })
	clients := map[bool]*http.Client{true: loopback.HTTPClient(trustedIP, 10*time.Second), false: loopback.HTTPClient(untrustedIP, 10*time.Second)}
	return func(t *testing.T, row conformance.Row) conformance.Seen {
		req, err := http.NewRequest("POST", "http://"+lis.Addr().String()+row.Path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if row.Host != "" {
			req.Host = row.Host
		}
		for _, kv := range row.Header {
			req.Header[kv[0]] = append(req.Header[kv[0]], kv[1]) // as spelled: the server canonicalizes
		}
		resp, err := clients[row.Trusted].Do(req)
		if err != nil {
			t.Fatalf("HTTP %s: %v", row.Path, err)
		}
		resp.Body.Close()
		if oe, ok := triagehttp.FromResponse(resp); ok {
			return conformance.Seen{Outcome: oe.Kind}
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("HTTP %s: %s", row.Path, resp.Status)
		}
		return rec.Take()
	}
}

// grpcCaller sends a row as a gRPC call to addr, from the row's caller
// (one connection per caller and authority), and returns its outcome, or
// what rec recorded at the handler.
func grpcCaller(t *testing.T, addr string, rec *conformance.Recorder) func(*testing.T, conformance.Row) conformance.Seen {
	conns := map[string]*grpc.ClientConn{}
	conn := func(trusted bool, host string) *grpc.ClientConn {
		src := untrustedIP
		if trusted {
			src = trustedIP
		}
		key := src + "|" + host
		if cc := conns[key]; cc != nil {
			return cc
		}
		var opts []grpc.DialOption
		if host != "" {
			opts = append(opts, grpc.WithAuthority(host))
		}
		cc := dialFrom(t, src, addr, opts...)
		conns[key] = cc
		return cc
	}
	return func(t *testing.T, row conformance.Row) conformance.Seen {
		md := metadata.MD{}
		for _, kv := range row.Header {
			k := strings.ToLower(kv[0]) // gRPC metadata keys are lower case
			md[k] = append(md[k], kv[1])
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ctx = metadata.NewOutgoingContext(ctx, md)
		err := conn(row.Trusted, row.Host).Invoke(ctx, row.Path, &emptypb.Empty{}, &emptypb.Empty{}, grpc.WaitForReady(true))
		if err != nil {
			oe, ok := triagegrpc.FromStatus(status.Convert(err))
			if !ok {
				t.Fatalf("gRPC %s: %v", row.Path, err)
			}
			return conformance.Seen{Outcome: oe.Kind}
		}
		s := rec.Take()
		s.Deadline = conformance.WithoutCallDeadline(s.Deadline)
		return s
	}
}
