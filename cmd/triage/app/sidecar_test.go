package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/internal/testkit/testcert"
)

// echo answers with the criticality it was sent and its name.
func echo(name string) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, name+":"+r.Header.Get("Triage-Criticality")+":"+r.URL.Path)
	}))
}

func freePort(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}

func get(t *testing.T, url string, header ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The sidecar forwards with the criticality its edge gave, answers its
// probes itself, forwards the service's own calls through -egress, reads
// its -config again when it changes, and stops on cancel.
func TestSidecarCommand(t *testing.T) {
	up, other := echo("upstream"), echo("other")
	defer up.Close()
	defer other.Close()
	cfg := filepath.Join(t.TempDir(), "edge.yaml")
	write := func(s string) {
		if err := os.WriteFile(cfg, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("trust:\n  networks: [127.0.0.1/32]\ncriticality:\n  rules:\n    - header: true\n    - path_prefix: /batch\n      criticality: SHEDDABLE\n")
	egressAddr, metricsAddr := freePort(t), freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, done, errb := startCommand(t, ctx, "sidecar", "-listen", "127.0.0.1:0", "-upstream", up.URL, "-config", cfg,
		"-egress", egressAddr+"="+other.URL, "-drain", "0s", "-metrics", metricsAddr)
	base := "http://" + addr
	if code, body := get(t, base+"/a", "Triage-Criticality", "SHEDDABLE_PLUS"); code != 200 || body != "upstream:SHEDDABLE_PLUS:/a" {
		t.Errorf("through the sidecar: %d %q", code, body)
	}
	if code, body := get(t, base+"/batch/x"); code != 200 || body != "upstream:SHEDDABLE:/batch/x" {
		t.Errorf("the path rule: %d %q", code, body)
	}
	for _, p := range []string{"/triage/ready", "/triage/live"} {
		if code, _ := get(t, base+p); code != 200 {
			t.Errorf("%s: %d", p, code)
		}
		// The metrics listener answers the probes too: a kubelet cannot
		// present the client certificate the serving address asks for.
		if code, body := get(t, "http://"+metricsAddr+p); code != 200 || strings.Contains(body, "triage_") {
			t.Errorf("%s on the metrics listener: %d %.40q", p, code, body)
		}
	}
	if code, body := get(t, "http://"+metricsAddr+"/metrics"); code != 200 || !strings.Contains(body, "triage_edge_requests_total") ||
		!strings.Contains(body, "\ngo_goroutines ") || !strings.Contains(body, "\nprocess_resident_memory_bytes ") {
		t.Errorf("/metrics, want triage's, the runtime's and the process's: %d %.60q", code, body)
	}
	if code, body := get(t, "http://"+egressAddr+"/b", "Triage-Criticality", "CRITICAL_PLUS"); code != 200 || body != "other:CRITICAL_PLUS:/b" {
		t.Errorf("through the egress: %d %q", code, body)
	}
	write("trust:\n  networks: [127.0.0.1/32]\ncriticality:\n  rules:\n    - header: true\n    - path_prefix: /batch\n      criticality: SHEDDABLE_PLUS\n")
	loopback.WaitFor(t, "the new rule", func() bool {
		_, body := get(t, base+"/batch/x")
		return body == "upstream:SHEDDABLE_PLUS:/batch/x"
	})
	cancel()
	waitExit(t, done, errb, 10*time.Second, "the sidecar did not stop")
}

func TestSidecarFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sidecar"}, "-upstream is required"},
		{[]string{"sidecar", "-upstream", "ftp://127.0.0.1:1"}, "scheme"},
		{[]string{"sidecar", "-upstream", "http://127.0.0.1"}, "HOST:PORT"},
		{[]string{"sidecar", "-upstream", "http://192.0.2.1:80"}, "beyond loopback in the clear"},
		{[]string{"sidecar", "-upstream", "http://127.0.0.1:1", "-listen", "0.0.0.0:1"}, "-unauthenticated"},
		{[]string{"sidecar", "-upstream", "http://127.0.0.1:1", "-egress", "127.0.0.1:1"}, "LISTEN=URL"},
		{[]string{"sidecar", "-upstream", "http://127.0.0.1:1", "-egress", "0.0.0.0:1=http://127.0.0.1:2"}, "only on loopback"},
		{[]string{"sidecar", "-upstream", "http://127.0.0.1:1", "-min-inflight", "0"}, "-min-inflight"},
		{[]string{"sidecar", "-upstream", "http://127.0.0.1:1", "-tolerance", "1"}, "-tolerance"},
		{[]string{"sidecar", "-upstream", "http://127.0.0.1:1", "-max-wait-services", "-1"}, "-max-wait-services"},
		{[]string{"extproc", "-max-wait-services", "NaN"}, "-max-wait-services"},
		{[]string{"sidecar", "-upstream", "http://127.0.0.1:1", "-limit-rule", "vegas"}, "-limit-rule"},
		{[]string{"sidecar", "-upstream", "http://127.0.0.1:1", "-body-timeout", "0s"}, "-body-timeout"},
		{[]string{"sidecar", "-upstream", "http://127.0.0.1:1", "-peer-share", "-1"}, "-peer-share"},
		{[]string{"sidecar", "-upstream", "http://127.0.0.1:1", "-body-min-rate", "-1"}, "-body-min-rate"},
		{[]string{"sidecar", "-upstream", "http://127.0.0.1:1", "-config", "x.yaml", "-trust", "127.0.0.1/32"}, "-config names whom to trust"},
		{[]string{"sidecar", "-upstream", "http://127.0.0.1:1", "-config", "/nonexistent.yaml"}, "nonexistent"},
		{[]string{"sidecar", "-upstream", "http://127.0.0.1:1", "-upstream-tls-ca", "ca.pem"}, "https upstream"},
		{[]string{"sidecar", "-upstream", "http://127.0.0.1:1", "-egress", "127.0.0.1:2=http://192.0.2.1:80"}, "-insecure-egress"},
		{[]string{"extproc", "-listen", "0.0.0.0:1"}, "-unauthenticated"},
		{[]string{"extproc", "-max-wait", "0s"}, "-max-wait"},
		{[]string{"extproc", "-trust", "300.0.0.1/8"}, "-trust"},
		{[]string{"extproc", "extra"}, "unexpected argument"},
		{[]string{"sidecar", "-upstream", "http://127.0.0.1:1", "-health-check", "healthz"}, "not a path"},
		{[]string{"extproc", "-group-header", "x plan"}, "not a header name"},
	} {
		var o, e strings.Builder
		if code := run(context.Background(), tc.args, &o, &e); code != 2 || !strings.Contains(e.String(), tc.want) {
			t.Errorf("%q: exit %d, stderr %q, want 2 and %q", tc.args, code, e.String(), tc.want)
		}
	}
}

// triage extproc answers Envoy's ext_proc protocol and gRPC health, and
// keeps a controller for each upstream cluster Envoy names.
func TestExtprocCommand(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	metricsAddr := freePort(t)
	addr, done, errb := startCommand(t, ctx, "extproc", "-listen", "127.0.0.1:0", "-trust", "127.0.0.1/32", "-drain", "0s", "-metrics", metricsAddr)
	for _, p := range []string{"/triage/ready", "/triage/live"} {
		if code, body := get(t, "http://"+metricsAddr+p); code != 200 || strings.Contains(body, "triage_") {
			t.Errorf("%s on the metrics listener: %d %.40q", p, code, body)
		}
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hctx, hcancel := context.WithTimeout(ctx, 5*time.Second)
	defer hcancel()
	if h, err := healthpb.NewHealthClient(cc).Check(hctx, &healthpb.HealthCheckRequest{}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, %v", h, err)
	}
	stream, err := extprocv3.NewExternalProcessorClient(cc).Process(hctx)
	if err != nil {
		t.Fatal(err)
	}
	attrs, _ := structpb.NewStruct(map[string]any{"source.address": "127.0.0.1:4000", "xds.cluster_name": "orders"})
	err = stream.Send(&extprocv3.ProcessingRequest{
		Attributes: map[string]*structpb.Struct{"envoy.filters.http.ext_proc": attrs},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: true, Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":path", RawValue: []byte("/x")}, {Key: ":authority", RawValue: []byte("shop")}, {Key: "triage-criticality", RawValue: []byte("SHEDDABLE_PLUS")},
		}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	set := resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()
	if len(set) != 1 || set[0].GetHeader().GetKey() != "triage-criticality" || string(set[0].GetHeader().GetRawValue()) != "SHEDDABLE_PLUS" {
		t.Errorf("request headers answered %v", resp)
	}
	// Each upstream cluster has its own controller, its state labelled.
	_, body := get(t, "http://"+metricsAddr+"/metrics")
	for _, want := range []string{`triage_admission_pending{cluster="orders"} 1`, `triage_admission_pending{cluster=""} 0`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics: no %s", want)
		}
	}
	stream.CloseSend()
	cancel()
	waitExit(t, done, errb, 15*time.Second, "extproc did not stop")
}

// triage sidecar with TLS on both sides: callers present certificates the
// CA verifies, and only -trust-identity's criticality is believed; the
// upstream is https and requires the sidecar's own certificate.
func TestSidecarTLS(t *testing.T) {
	ca, err := testcert.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	os.WriteFile(caFile, ca.PEM(), 0o600)
	scCert, scKey, _ := writeLeaf(t, ca, dir, "sidecar", "spiffe://test/sidecar")
	_, _, upPair := writeLeaf(t, ca, dir, "upstream", "spiffe://test/upstream")
	_, _, frontend := writeLeaf(t, ca, dir, "frontend", "spiffe://test/frontend")
	_, _, other := writeLeaf(t, ca, dir, "other", "spiffe://test/other")
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM())

	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peer := ""
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && len(r.TLS.PeerCertificates[0].URIs) > 0 {
			peer = r.TLS.PeerCertificates[0].URIs[0].String()
		}
		io.WriteString(w, peer+" "+r.Header.Get("Triage-Criticality"))
	}))
	up.TLS = &tls.Config{Certificates: []tls.Certificate{upPair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	up.StartTLS()
	defer up.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, done, errb := startCommand(t, ctx, "sidecar", "-listen", "127.0.0.1:0", "-upstream", "https://"+up.Listener.Addr().String(),
		"-tls-cert", scCert, "-tls-key", scKey, "-tls-ca", caFile, "-trust-identity", "spiffe://test/frontend",
		"-upstream-tls-ca", caFile, "-upstream-tls-cert", scCert, "-upstream-tls-key", scKey, "-drain", "0s")
	call := func(cert *tls.Certificate) (string, error) {
		cfg := &tls.Config{RootCAs: pool}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
		req, _ := http.NewRequest("GET", "https://"+addr+"/x", nil)
		req.Header.Set("Triage-Criticality", "SHEDDABLE_PLUS")
		resp, err := c.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b), nil
	}
	if got, err := call(&frontend); err != nil || got != "spiffe://test/sidecar SHEDDABLE_PLUS" {
		t.Errorf("trusted identity: %q, %v; want the sidecar's certificate upstream and SHEDDABLE_PLUS", got, err)
	}
	if got, err := call(&other); err != nil || got != "spiffe://test/sidecar CRITICAL" {
		t.Errorf("another identity: %q, %v; want its claim stripped (CRITICAL)", got, err)
	}
	if got, err := call(nil); err == nil {
		t.Errorf("no client certificate: answered %q", got)
	}
	cancel()
	waitExit(t, done, errb, 10*time.Second, "the sidecar did not stop")
}

// A service's calls to a third party through -egress carry none of
// triage's headers (issue 55: every egress upstream got the customer and
// the criticality); the cluster's own services get them.
func TestEgressKeysOnlyForInternalHosts(t *testing.T) {
	for host, want := range map[string]bool{
		"orders": true, "orders.shop.svc": true, "orders.shop.svc.cluster.local.": true, "db.internal": true,
		"localhost": true, "127.0.0.1": true, "10.1.2.3": true, "::1": true, "printer.local": true,
		"api.stripe.com": false, "8.8.8.8": false, "example.com": false, "": false, "svc": true, "evil.svc.example.com": false,
	} {
		if got := clusterInternal(host); got != want {
			t.Errorf("clusterInternal(%q) = %v, want %v", host, got, want)
		}
	}
	seen := make(chan http.Header, 2)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen <- r.Header.Clone() }))
	defer up.Close()
	for _, tc := range []struct {
		flags []string
		want  bool
	}{{nil, true}, {[]string{"-egress-internal", ".example.com"}, false}} {
		egressAddr := freePort(t)
		ctx, cancel := context.WithCancel(context.Background())
		args := append([]string{"sidecar", "-listen", "127.0.0.1:0", "-upstream", up.URL, "-egress", egressAddr + "=" + up.URL, "-drain", "0s"}, tc.flags...)
		_, done, errb := startCommand(t, ctx, args...)
		if code, _ := get(t, "http://"+egressAddr+"/", "Triage-Criticality", "CRITICAL_PLUS", "Triage-Customer", "alice"); code != 200 {
			t.Fatalf("%v: through the egress: %d", tc.flags, code)
		}
		h := <-seen
		if got := h.Get("Triage-Criticality") != "" || h.Get("Triage-Customer") != ""; got != tc.want {
			t.Errorf("%v: the upstream got triage headers %v, want %v: %v", tc.flags, got, tc.want, h)
		}
		cancel()
		waitExit(t, done, errb, 10*time.Second, "the sidecar did not stop")
	}
}

// -group-header names the header the edge's group rules read; without it
// no request is in a group.
func TestSidecarGroupHeader(t *testing.T) {
	up := echo("upstream")
	defer up.Close()
	cfg := groupConfig(t)
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"-group-header", "X-Plan", "-health-check", "/healthz"}, "upstream:SHEDDABLE_PLUS:/a"},
		{nil, "upstream:CRITICAL:/a"},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		addr, done, errb := startCommand(t, ctx, append([]string{"sidecar", "-listen", "127.0.0.1:0", "-upstream", up.URL, "-config", cfg, "-drain", "0s"}, tc.flags...)...)
		if code, body := get(t, "http://"+addr+"/a", "X-Plan", "free"); code != 200 || body != tc.want {
			t.Errorf("flags %v, a request of the free group: %d %q, want %q", tc.flags, code, body, tc.want)
		}
		cancel()
		waitExit(t, done, errb, 10*time.Second, "the sidecar did not stop")
	}
}

// With -upstream-load the sidecar sheds by the load the upstream reports
// (ORCA's header): SHEDDABLE is refused while it reports 0.95, and the
// reading is exported as an admission signal; by default it is not.
func TestSidecarShedsByTheUpstreamsLoad(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Endpoint-Load-Metrics", "TEXT application_utilization=0.95")
	}))
	defer up.Close()
	for _, on := range []bool{true, false} {
		metricsAddr := freePort(t)
		ctx, cancel := context.WithCancel(context.Background())
		args := []string{"-listen", "127.0.0.1:0", "-upstream", up.URL, "-trust", "127.0.0.1/32", "-metrics", metricsAddr, "-drain", "0s"}
		if on {
			args = append(args, "-upstream-load")
		}
		addr, done, errb := startCommand(t, ctx, append([]string{"sidecar"}, args...)...)
		base := "http://" + addr
		if code, _ := get(t, base+"/", "Triage-Criticality", "CRITICAL_PLUS"); code != 200 {
			t.Errorf("-upstream-load=%v: CRITICAL_PLUS %d", on, code)
		}
		want := 200
		if on {
			want = 503
		}
		if code, _ := get(t, base+"/", "Triage-Criticality", "SHEDDABLE"); code != want {
			t.Errorf("-upstream-load=%v: SHEDDABLE at a reported 0.95: %d, want %d", on, code, want)
		}
		_, body := get(t, "http://"+metricsAddr+"/metrics")
		if got := strings.Contains(body, `triage_admission_signal_ratio{signal="upstream"} 0.95`); got != on {
			t.Errorf("-upstream-load=%v: the upstream's load exported: %v", on, got)
		}
		cancel()
		waitExit(t, done, errb, 10*time.Second, "the sidecar did not stop")
	}
}

// extprocLevel sends one request's headers to the processor at addr and
// returns the criticality it sets, or "" if it sets none.
func extprocLevel(t *testing.T, addr string, headers ...string) string {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := extprocv3.NewExternalProcessorClient(cc).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.CloseSend()
	hs := []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/a")}, {Key: ":authority", RawValue: []byte("shop")}}
	for i := 0; i+1 < len(headers); i += 2 {
		hs = append(hs, &corev3.HeaderValue{Key: headers[i], RawValue: []byte(headers[i+1])})
	}
	attrs, _ := structpb.NewStruct(map[string]any{"source.address": "127.0.0.1:4000"})
	if err := stream.Send(&extprocv3.ProcessingRequest{
		Attributes: map[string]*structpb.Struct{"envoy.filters.http.ext_proc": attrs},
		Request:    &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: true, Headers: &corev3.HeaderMap{Headers: hs}}},
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == "triage-criticality" {
			return string(h.GetHeader().GetRawValue())
		}
	}
	return ""
}

// groupConfig writes an edge configuration trusting loopback whose one
// rule puts the group "free" at SHEDDABLE_PLUS, and returns its path.
func groupConfig(t *testing.T) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(cfg, []byte("trust:\n  networks: [127.0.0.1/32]\ncriticality:\n  rules:\n    - group: free\n      criticality: SHEDDABLE_PLUS\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The processor's -group-header, as the sidecar's: the edge's group rules
// read the header it names; without it they match nothing.
func TestExtprocGroupHeader(t *testing.T) {
	cfg := groupConfig(t)
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"-group-header", "X-Plan"}, "SHEDDABLE_PLUS"},
		{nil, "CRITICAL"},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		addr, done, errb := startCommand(t, ctx, append([]string{"extproc", "-listen", "127.0.0.1:0", "-config", cfg, "-drain", "0s"}, tc.flags...)...)
		if got := extprocLevel(t, addr, "x-plan", "free"); got != tc.want {
			t.Errorf("flags %v, a request of the free group: criticality %q, want %q", tc.flags, got, tc.want)
		}
		cancel()
		waitExit(t, done, errb, 15*time.Second, "extproc did not stop")
	}
}

// gRPC in the clear (h2c on both sides) passes through the sidecar, call
// after call on one connection, and an HTTP/1.1 request that asks to
// close gets its whole answer and then the end of the connection.
func TestSidecarCarriesH2CAndHTTP1Close(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("shop", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	go gs.Serve(lis)
	defer gs.Stop()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, done, errb := startCommand(t, ctx, "sidecar", "-listen", "127.0.0.1:0", "-upstream", "h2c://"+lis.Addr().String(), "-trust", "127.0.0.1/32", "-drain", "0s")
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	for i := range 20 {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := healthpb.NewHealthClient(cc).Check(cctx, &healthpb.HealthCheckRequest{Service: "shop"})
		ccancel()
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("call %d through the sidecar: %v, %v", i, resp.GetStatus(), err)
		}
	}

	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n")
	b, err := io.ReadAll(conn)
	if err != nil || !strings.HasPrefix(string(b), "HTTP/1.1 ") || !strings.Contains(string(b), "Connection: close") {
		t.Fatalf("an HTTP/1.1 request asking to close: %q, %v; want an answer and the end of the connection", b, err)
	}
	cancel()
	waitExit(t, done, errb, 10*time.Second, "the sidecar did not stop")
}
