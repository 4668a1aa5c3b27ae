package triagesidecar_test

import (
	"context"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/orca"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/signals"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/triagesidecar"
	"github.com/triagehq/triage/trust"
	"github.com/triagehq/triage/wire"
)

// loadIngress is an Ingress to up whose admission sheds by the load the
// upstream reports (admission's default thresholds: SHEDDABLE all shed at
// 0.9, CRITICAL_PLUS none up to 0.95).
func loadIngress(t *testing.T, up string) http.Handler {
	t.Helper()
	sig, err := signals.NewReported("upstream", time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := admission.New(admission.WithTolerance(1.2), admission.WithSignal(sig, admission.DefaultThresholds()))
	if err != nil {
		t.Fatal(err)
	}
	pol := trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})
	in, err := triagesidecar.Ingress(mustURL(t, up), triagesidecar.WithUpstreamLoad(sig),
		triagesidecar.WithMiddleware(triagehttp.WithIntake(intake.WithTrust(pol)), triagehttp.WithAdmission(ctl)))
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// An HTTP upstream that reports its load in ORCA's text header: once it
// reports 0.95, SHEDDABLE is refused at the sidecar and CRITICAL_PLUS
// still served; once it reports 0.2 again, SHEDDABLE is served.
func TestIngressShedsByTheUpstreamsReportedLoad(t *testing.T) {
	var load atomic.Value
	load.Store("0.95")
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(wire.LoadReportHeader, "TEXT cpu_utilization=0.1, application_utilization="+load.Load().(string))
	}))
	defer up.Close()
	addr := serve(t, loadIngress(t, up.URL))
	call := func(level string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+addr+"/", nil)
		req.Header.Set(wire.CriticalityHeader, level)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := call("SHEDDABLE"); c != http.StatusOK {
		t.Fatalf("SHEDDABLE before any report: %d, want 200", c)
	}
	for i := range 5 { // the upstream reported 0.95
		if c := call("SHEDDABLE"); c != http.StatusServiceUnavailable {
			t.Fatalf("SHEDDABLE %d at a reported 0.95: %d, want 503", i, c)
		}
		if c := call("CRITICAL_PLUS"); c != http.StatusOK {
			t.Fatalf("CRITICAL_PLUS %d at a reported 0.95: %d, want 200", i, c)
		}
	}
	load.Store("0.2")
	if c := call("CRITICAL_PLUS"); c != http.StatusOK {
		t.Fatalf("CRITICAL_PLUS: %d", c)
	}
	if c := call("SHEDDABLE"); c != http.StatusOK {
		t.Fatalf("SHEDDABLE once the upstream reports 0.2: %d, want 200", c)
	}
}

// loadReporter is a gRPC upstream that reports its application
// utilization in every call's ORCA trailer (grpc-go's orca package).
type loadReporter struct {
	testgrpc.UnimplementedTestServiceServer
	load atomic.Uint64 // float64 bits
}

func (s *loadReporter) EmptyCall(ctx context.Context, _ *testgrpc.Empty) (*testgrpc.Empty, error) {
	orca.CallMetricsRecorderFromContext(ctx).SetApplicationUtilization(math.Float64frombits(s.load.Load()))
	return &testgrpc.Empty{}, nil
}

// A grpc-go upstream reporting its load in ORCA's trailer, as grpc-go's
// weighted round robin reads it: the sidecar sheds SHEDDABLE calls while
// it reports 0.95, not CRITICAL_PLUS.
func TestIngressShedsByAGRPCUpstreamsTrailer(t *testing.T) {
	rep := &loadReporter{}
	rep.load.Store(math.Float64bits(0.95))
	gs := grpc.NewServer(orca.CallMetricsServerOption(nil))
	testgrpc.RegisterTestServiceServer(gs, rep)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	defer gs.Stop()
	cc, err := grpc.NewClient(serve(t, loadIngress(t, "h2c://"+lis.Addr().String())), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := testgrpc.NewTestServiceClient(cc)
	call := func(level string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := client.EmptyCall(metadata.NewOutgoingContext(ctx, metadata.Pairs(wire.CriticalityKey, level)), &testgrpc.Empty{})
		return err
	}
	if err := call("CRITICAL_PLUS"); err != nil {
		t.Fatalf("CRITICAL_PLUS: %v", err)
	}
	for i := range 5 {
		if err := call("SHEDDABLE"); status.Code(err) != codes.Unavailable {
			t.Fatalf("SHEDDABLE %d at a reported 0.95: %v, want UNAVAILABLE", i, err)
		}
		if err := call("CRITICAL_PLUS"); err != nil {
			t.Fatalf("CRITICAL_PLUS %d at a reported 0.95: %v", i, err)
		}
	}
	rep.load.Store(math.Float64bits(0.1))
	if err := call("CRITICAL_PLUS"); err != nil {
		t.Fatal(err)
	}
	if err := call("SHEDDABLE"); err != nil {
		t.Fatalf("SHEDDABLE once the upstream reports 0.1: %v", err)
	}
}
