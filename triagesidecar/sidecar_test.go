package triagesidecar_test

import (
	"context"

	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/triagesidecar"
	"github.com/triagehq/triage/trust"
)

// serve runs h on a loopback listener speaking HTTP/1.1 and cleartext
// HTTP/2, as triage sidecar does, and returns its address.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return lis.Addr().String()
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// An untrusted caller's triage headers are stripped; the upstream
// receives the criticality the edge rules gave, the caller's Host and
// path, and X-Forwarded-For.
func TestIngressForwardsWhatTheEdgeDecided(t *testing.T) {
	got := make(chan http.Header, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Clone()
		h.Set("X-Path", r.URL.Path)
		h.Set("X-Host", r.Host)
		got <- h
		io.WriteString(w, "ok")
	}))
	defer up.Close()
	cl, err := edge.New(edge.Config{Default: "SHEDDABLE", Rules: []edge.RuleConfig{{PathPrefix: "/checkout", Criticality: "CRITICAL_PLUS"}}})
	if err != nil {
		t.Fatal(err)
	}
	in, err := triagesidecar.Ingress(mustURL(t, up.URL+"/base"), triagesidecar.WithMiddleware(triagehttp.WithIntake(intake.WithClassifier(cl))))
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, in)
	req, _ := http.NewRequest("GET", "http://"+addr+"/checkout/cart", nil)
	req.Host = "shop.example"
	req.Header.Set("Triage-Criticality", "SHEDDABLE")
	req.Header.Set("Triage-Customer", "mallory")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("got %d %q, want 200 ok", resp.StatusCode, body)
	}
	h := <-got
	for name, want := range map[string]string{
		"Triage-Criticality": "CRITICAL_PLUS", "Triage-Customer": "", "X-Path": "/base/checkout/cart",
		"X-Host": "shop.example", "X-Forwarded-For": "127.0.0.1",
	} {
		if h.Get(name) != want {
			t.Errorf("upstream got %s %q, want %q", name, h.Get(name), want)
		}
	}
}

// grpcUpstream serves srv's TestService over cleartext HTTP/2 on
// loopback, as a gRPC upstream without TLS, and returns its h2c URL.
func grpcUpstream(t *testing.T, srv testgrpc.TestServiceServer) *url.URL {
	t.Helper()
	gs := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(gs, srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return mustURL(t, "h2c://"+lis.Addr().String())
}

// recorder is a gRPC upstream that records what each call arrived with.
type recorder struct {
	testgrpc.UnimplementedTestServiceServer
	crit     atomic.Value // string
	deadline atomic.Int64 // ns left at arrival
}

func (r *recorder) EmptyCall(ctx context.Context, _ *testgrpc.Empty) (*testgrpc.Empty, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	r.crit.Store(strings.Join(md.Get("triage-criticality"), ","))
	if dl, ok := ctx.Deadline(); ok {
		r.deadline.Store(int64(time.Until(dl)))
	}
	return &testgrpc.Empty{}, nil
}

// A gRPC client calls through the sidecar to a gRPC upstream over h2c:
// the call is forwarded with its criticality and what is left of its
// deadline, and a refused call comes back as the status triagegrpc
// reads (task overloaded), not as an HTTP error.
func TestIngressSpeaksGRPC(t *testing.T) {
	rec := &recorder{}
	up := grpcUpstream(t, rec)

	ctl, err := admission.New(admission.WithTolerance(1.2))
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.ForceShed(criticality.Sheddable, 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	pol := trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})
	in, err := triagesidecar.Ingress(up, triagesidecar.WithMiddleware(triagehttp.WithIntake(intake.WithTrust(pol)), triagehttp.WithAdmission(ctl)))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(serve(t, in), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := testgrpc.NewTestServiceClient(cc)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	md := metadata.Pairs("triage-criticality", "SHEDDABLE_PLUS")
	if _, err := client.EmptyCall(metadata.NewOutgoingContext(ctx, md), &testgrpc.Empty{}); err != nil {
		t.Fatalf("SHEDDABLE_PLUS through the sidecar: %v", err)
	}
	if c := rec.crit.Load(); c != "SHEDDABLE_PLUS" {
		t.Errorf("upstream got criticality %q, want SHEDDABLE_PLUS", c)
	}
	if left := time.Duration(rec.deadline.Load()); left <= 3*time.Second || left > 5*time.Second {
		t.Errorf("upstream's deadline %v ahead, want the caller's 5 s less the hop", left)
	}

	md = metadata.Pairs("triage-criticality", "SHEDDABLE")
	_, err = client.EmptyCall(metadata.NewOutgoingContext(ctx, md), &testgrpc.Empty{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("SHEDDABLE under a forced shed: %v, want UNAVAILABLE", err)
	}
	if oe, ok := triagegrpc.FromStatus(status.Convert(err)); !ok || oe.Kind != outcome.TaskOverloaded {
		t.Errorf("refusal %v does not read as task overloaded", err)
	}
}

// An upstream that cannot be reached is a 502 for HTTP and UNAVAILABLE
// (not an overload outcome) for gRPC.
func TestIngressUpstreamDown(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	in, err := triagesidecar.Ingress(mustURL(t, "h2c://"+dead))
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, in)
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("HTTP with the upstream down: %d, want 502", resp.StatusCode)
	}
	_, err = testClient(t, addr).EmptyCall(context.Background(), &testgrpc.Empty{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "triagesidecar: upstream") {
		t.Fatalf("gRPC with the upstream down: %v, want UNAVAILABLE from the sidecar", err)
	}
	if _, ok := triagegrpc.FromStatus(status.Convert(err)); ok {
		t.Errorf("an unreachable upstream reads as an overload outcome: %v", err)
	}
}

// Egress retries what the upstream refused as task overloaded, with the
// attempt counter and the criticality the service passed on, and sends
// the body again; when its policy gives up, the service gets "overloaded;
// don't retry".
func TestEgressRetriesAndGivesUp(t *testing.T) {
	var calls atomic.Int32
	var failFirst atomic.Int32
	failFirst.Store(1)
	type seen struct{ attempt, crit, body string }
	got := make(chan seen, 16)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Header.Get("Triage-Attempt"), r.Header.Get("Triage-Criticality"), string(b)}
		if calls.Add(1) <= failFirst.Load() {
			triagehttp.WriteError(w, outcome.New(outcome.TaskOverloaded, "busy"))
			return
		}
		io.WriteString(w, "done")
	}))
	defer up.Close()
	pol, err := retry.New()
	if err != nil {
		t.Fatal(err)
	}
	caller, err := egress.New(egress.WithPolicy(pol), egress.WithInternal("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	eg, err := triagesidecar.Egress(mustURL(t, up.URL), caller)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, eg)
	post := func() (*http.Response, string) {
		req, _ := http.NewRequest("POST", "http://"+addr+"/orders", strings.NewReader("order-1"))
		req.Header.Set("Triage-Criticality", "CRITICAL_PLUS")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	resp, body := post()
	if resp.StatusCode != 200 || body != "done" {
		t.Fatalf("got %d %q, want the retry's 200", resp.StatusCode, body)
	}
	first, second := <-got, <-got
	if first.attempt != "" || second.attempt != "1" || first.crit != "CRITICAL_PLUS" || second.crit != "CRITICAL_PLUS" ||
		first.body != "order-1" || second.body != "order-1" {
		t.Errorf("attempts: %+v then %+v, want attempt 0 then 1, CRITICAL_PLUS, the body both times", first, second)
	}

	failFirst.Store(1 << 20)
	resp, _ = post()
	oe, ok := triagehttp.FromResponse(resp)
	if !ok || oe.Kind != outcome.DontRetry {
		t.Fatalf("upstream always overloaded: %d %v, want 503 overloaded-dont-retry", resp.StatusCode, resp.Header)
	}
	// Three attempts at most; the retry budget (10% of requests, and the
	// first request's retry already spent it) may allow fewer.
	if n := len(got); n < 1 || n > 3 {
		t.Errorf("upstream saw %d attempts of the refused request, want 1 to 3", n)
	}
}

func TestBadConfig(t *testing.T) {
	for _, u := range []string{"ftp://x:1", "http://", "unix:///tmp/s"} {
		if _, err := triagesidecar.Ingress(mustURL(t, u)); err == nil {
			t.Errorf("Ingress(%q): no error", u)
		}
	}
	if _, err := triagesidecar.Egress(mustURL(t, "http://127.0.0.1:1"), nil); err == nil {
		t.Error("Egress without a Caller: no error")
	}
	if _, err := triagesidecar.Ingress(mustURL(t, "http://127.0.0.1:1"), triagesidecar.WithTimeout(-1)); err == nil {
		t.Error("negative timeout: no error")
	}
}

// echoStream is a gRPC upstream whose FullDuplexCall answers each
// message as it comes.
type echoStream struct {
	testgrpc.UnimplementedTestServiceServer
}

func (echoStream) FullDuplexCall(s testgrpc.TestService_FullDuplexCallServer) error {
	for {
		req, err := s.Recv()
		if err != nil {
			return nil
		}
		if err := s.Send(&testgrpc.StreamingOutputCallResponse{Payload: req.Payload}); err != nil {
			return err
		}
	}
}

// A bidirectional stream whose client waits for each answer before it
// sends the next message goes through the sidecar under admission: the
// read-ahead takes the first message, not the whole stream (it would
// wait out the message timeout and answer 408).
func TestIngressBidiStream(t *testing.T) {
	up := grpcUpstream(t, echoStream{})
	ctl, err := admission.New(admission.WithTolerance(1.2), admission.WithMessageTimeout(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	in, err := triagesidecar.Ingress(up, triagesidecar.WithMiddleware(triagehttp.WithAdmission(ctl)))
	if err != nil {
		t.Fatal(err)
	}
	fullDuplex(t, serve(t, in))
}

// fullDuplex makes a full-duplex call to the echo service at addr whose
// client waits for each answer before it sends the next message.
func fullDuplex(t *testing.T, addr string) {
	t.Helper()
	client := testClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := client.FullDuplexCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, body := range []string{"one", "two", "three"} {
		if err := stream.Send(&testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: []byte(body)}}); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		resp, err := stream.Recv()
		if err != nil || string(resp.GetPayload().GetBody()) != body {
			t.Fatalf("answer %d: %v, %v", i, resp, err)
		}
	}
	stream.CloseSend()
	if _, err := stream.Recv(); err != io.EOF {
		t.Errorf("end of stream: %v", err)
	}
}

// A caller that goes away does not free its execution slot while the
// upstream still works on its request (an upstream in most languages
// finishes it anyway): admission keeps counting it, and the upstream's
// request is cancelled only after the abandon grace.
func TestIngressHoldsTheSlotUntilTheUpstreamAnswers(t *testing.T) {
	arrived, upstreamCancelled := make(chan struct{}, 1), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done() // like Python, it would finish; here it waits to see when the sidecar gives up on it
		close(upstreamCancelled)
	}))
	defer up.Close()
	ctl, err := admission.New(admission.WithTolerance(1.2), admission.WithLimits(1, 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	fake := clock.NewFake(time.Unix(0, 0))
	in, err := triagesidecar.Ingress(mustURL(t, up.URL), triagesidecar.WithClock(fake),
		triagesidecar.WithMiddleware(triagehttp.WithAdmission(ctl)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+serve(t, in)+"/", nil)
	go func() {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-arrived
	cancel()
	// The sidecar notices the caller left and starts the grace, unless it
	// cancels the upstream's request at once.
	if !fake.BlockUntil(1, upstreamCancelled) {
		t.Fatal("the upstream's request was cancelled as soon as the caller left: its slot was freed while the upstream worked")
	}
	if s := ctl.Stats(); s.Executing != 1 {
		t.Fatalf("after the caller left, %d executing, want 1: the upstream still works", s.Executing)
	}
	fake.Advance(triagesidecar.DefaultAbandonGrace)
	<-upstreamCancelled
	loopback.WaitFor(t, "the slot freed after the grace", func() bool { return ctl.Stats().Executing == 0 })
}

// testClient is a grpc-go client of addr, closed with the test.
func testClient(t *testing.T, addr string) testgrpc.TestServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return testgrpc.NewTestServiceClient(cc)
}
