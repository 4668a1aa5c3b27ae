package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/triagehq/triage/cmd/triage/app"
)

// collector is an OTLP/gRPC receiver on loopback that keeps what it is
// sent: the names of the metrics with a data point, and the spans'
// attribute keys.
type collector struct {
	colmetricpb.UnimplementedMetricsServiceServer
	mu      sync.Mutex
	metrics map[string]bool
	spans   []map[string]string
	service map[string]bool
}

func (c *collector) Export(_ context.Context, req *colmetricpb.ExportMetricsServiceRequest) (*colmetricpb.ExportMetricsServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rm := range req.ResourceMetrics {
		for _, a := range rm.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				c.service[a.GetValue().GetStringValue()] = true
			}
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				c.metrics[m.Name] = true
			}
		}
	}
	return &colmetricpb.ExportMetricsServiceResponse{}, nil
}

type traces struct {
	coltracepb.UnimplementedTraceServiceServer
	c *collector
}

func (t traces) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				attrs := map[string]string{"name": s.Name}
				for _, a := range s.Attributes {
					attrs[a.Key] = a.GetValue().String()
				}
				t.c.spans = append(t.c.spans, attrs)
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func startCollector(t *testing.T) (*collector, string) {
	t.Helper()
	c := &collector{metrics: map[string]bool{}, service: map[string]bool{}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	colmetricpb.RegisterMetricsServiceServer(gs, c)
	coltracepb.RegisterTraceServiceServer(gs, traces{c: c})
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return c, lis.Addr().String()
}

// syncBuffer is a bytes.Buffer safe for the command's writes and the
// test's reads; seen is closed once what it waits for has been written.
type syncBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	waitFor string
	seen    chan struct{}
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.b.Write(p)
	if s.seen != nil && s.waitFor != "" && strings.Contains(s.b.String(), s.waitFor) {
		close(s.seen)
		s.waitFor = ""
	}
	return n, err
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The sidecar built with OpenTelemetry exports triage's metrics and a span
// per request, with triage's decision on it, to a collector over OTLP;
// what is left goes out when it stops.
func TestSidecarExportsOTLP(t *testing.T) {
	col, endpoint := startCollector(t)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer upstream.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()

	ctx, cancel := context.WithCancel(context.Background())
	out, errb := syncBuffer{waitFor: "sidecar listening", seen: make(chan struct{})}, syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- app.Run(ctx, []string{"sidecar", "-listen", addr, "-upstream", upstream.URL, "-trust", "127.0.0.1/32",
			"-otlp-endpoint", endpoint, "-otlp-insecure", "-otlp-interval", "50ms", "-otlp-trace-ratio", "1"}, &out, &errb, app.WithTelemetry(&otlp{}))
	}()
	select {
	case <-out.seen:
	case code := <-done:
		t.Fatalf("the sidecar exited %d: %s %s", code, out.String(), errb.String())
	}
	for range 5 {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/x", nil)
		req.Header.Set("Triage-Criticality", "CRITICAL_PLUS")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("the sidecar exited %d: %s", code, errb.String())
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	for _, name := range []string{"triage.admission.admitted", "triage.admission.pending", "triage.admission.wait"} {
		if !col.metrics[name] {
			t.Errorf("no %s exported (got %v)", name, col.metrics)
		}
	}
	if !col.service["triage-sidecar"] {
		t.Errorf("service.name %v, want triage-sidecar", col.service)
	}
	var decided int
	for _, s := range col.spans {
		if strings.Contains(s["triage.criticality"], "CRITICAL_PLUS") {
			decided++
		}
	}
	if decided != 5 {
		t.Errorf("%d spans carry the requests' criticality, want 5: %v", decided, col.spans)
	}
}

// Without -otlp-endpoint (and no OTEL_EXPORTER_OTLP_ENDPOINT) nothing is
// exported; bad values are refused before serving.
func TestOTLPFlags(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	o := &otlp{interval: time.Second, ratio: DefaultTraceRatio}
	if s, err := o.Start(context.Background(), "sidecar"); s != nil || err != nil {
		t.Errorf("no endpoint: sink %v, err %v; want none", s, err)
	}
	for _, bad := range []*otlp{{endpoint: "127.0.0.1:1", interval: 0, ratio: 0.5}, {endpoint: "127.0.0.1:1", interval: time.Second, ratio: 2}} {
		if _, err := bad.Start(context.Background(), "sidecar"); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
	var out syncBuffer
	if code := app.Run(context.Background(), []string{"help", "sidecar"}, &out, &out, app.WithTelemetry(&otlp{})); code != 0 || !strings.Contains(out.String(), "-otlp-endpoint") {
		t.Errorf("help sidecar: %d, no -otlp-endpoint in %q", code, out.String())
	}
}

// The quota service built with OpenTelemetry exports its view over OTLP.
func TestQuotaServerExportsOTLP(t *testing.T) {
	col, endpoint := startCollector(t)
	policy := filepath.Join(t.TempDir(), "quota.yaml")
	if err := os.WriteFile(policy, []byte("customers: {ads: {cpu: 2}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out, errb := syncBuffer{waitFor: "quota service listening", seen: make(chan struct{})}, syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- app.Run(ctx, []string{"quota-server", "-policy", policy, "-listen", "127.0.0.1:0", "-drain", "0s",
			"-otlp-endpoint", endpoint, "-otlp-insecure", "-otlp-interval", "50ms"}, &out, &errb, app.WithTelemetry(&otlp{}))
	}()
	select {
	case <-out.seen:
	case code := <-done:
		t.Fatalf("quota-server exited %d: %s %s", code, out.String(), errb.String())
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("quota-server exited %d: %s", code, errb.String())
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	for _, name := range []string{"triage.quota.tasks", "triage.quota.refreshes"} {
		if !col.metrics[name] {
			t.Errorf("no %s exported (got %v)", name, col.metrics)
		}
	}
	if !col.service["triage-quota-server"] {
		t.Errorf("service.name %v, want triage-quota-server", col.service)
	}
}
