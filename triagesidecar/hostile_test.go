package triagesidecar_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/triagehq/triage/triagegrpc/batchproxy"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/h2attack"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/triagesidecar"
	"github.com/triagehq/triage/trust"
)

// naiveUpstream is an HTTP/1.1 keep-alive server that, as Python's
// http.server does for a GET, never reads a request's body: whatever the
// body holds is parsed as the next request on the connection. It records
// each request line with its Triage-Criticality header.
type naiveUpstream struct {
	addr       string
	readBodies bool // read each body by its Content-Length or chunks, as a sound server does
	mu         sync.Mutex
	seen       []string
}

func startNaiveUpstream(t *testing.T) *naiveUpstream { return startUpstream(t, false) }

func startUpstream(t *testing.T, readBodies bool) *naiveUpstream {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	u := &naiveUpstream{addr: lis.Addr().String(), readBodies: readBodies}
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go u.serve(c)
		}
	}()
	return u
}

func (u *naiveUpstream) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		crit, closing, length, chunked := "", false, 0, false
		for {
			h, err := br.ReadString('\n')
			if err != nil {
				return
			}
			h = strings.TrimRight(h, "\r\n")
			if h == "" {
				break
			}
			name, value, _ := strings.Cut(h, ":")
			switch strings.ToLower(name) {
			case "triage-criticality":
				crit = strings.TrimSpace(value)
			case "connection":
				closing = strings.EqualFold(strings.TrimSpace(value), "close")
			case "content-length":
				fmt.Sscan(strings.TrimSpace(value), &length)
			case "transfer-encoding":
				chunked = strings.Contains(strings.ToLower(value), "chunked")
			}
		}
		if u.readBodies && !readBody(br, length, chunked) {
			return
		}
		u.mu.Lock()
		u.seen = append(u.seen, strings.TrimSpace(line)+" criticality="+crit)
		u.mu.Unlock()
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		if closing {
			return
		}
	}
}

// readBody reads a body of length bytes, or chunks to the last.
func readBody(br *bufio.Reader, length int, chunked bool) bool {
	if !chunked {
		_, err := io.CopyN(io.Discard, br, int64(length))
		return err == nil
	}
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return false
		}
		var n int
		fmt.Sscanf(strings.TrimSpace(line), "%x", &n)
		if _, err := io.CopyN(io.Discard, br, int64(n)+2); err != nil { // the chunk and its CRLF
			return false
		}
		if n == 0 {
			return true // no trailers from Go's transport here
		}
	}
}

func (u *naiveUpstream) requests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen...)
}

// A GET's body is not a request: an upstream that does not read it must
// not run what it holds as a second request on the sidecar's connection,
// where it would carry the caller's triage keys and skip admission
// (issue 55). The sidecar closes the upstream connection after a request
// whose method gives its body no meaning.
func TestIngressDoesNotSmuggleABodyAsARequest(t *testing.T) {
	up := startNaiveUpstream(t)
	in, err := triagesidecar.Ingress(mustURL(t, "http://"+up.addr))
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, in)
	smuggled := "GET /admin HTTP/1.1\r\nHost: x\r\nTriage-Criticality: SMUGGLED\r\n\r\n"
	for _, method := range []string{"GET", "HEAD", "OPTIONS", "DELETE"} {
		req, _ := http.NewRequest(method, "http://"+addr+"/", strings.NewReader(smuggled))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		// A second request on the sidecar, which may reuse the upstream
		// connection: it must be the next thing the upstream parses.
		resp, err = http.Get("http://" + addr + "/next")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for _, r := range up.requests() {
		if strings.Contains(r, "/admin") || strings.Contains(r, "SMUGGLED") {
			t.Errorf("the upstream ran a request smuggled in a body: %q (all: %q)", r, up.requests())
		}
	}
	if n := len(up.requests()); n != 8 {
		t.Errorf("the upstream saw %d requests, want 8: %q", n, up.requests())
	}
}

// Clients that open no HTTP/2 flow-control window hold the sidecar's
// answers, and with them its slots to the upstream: with a grpc-go
// upstream behind the sidecar's defaults, 4 such connections of 30 calls
// each made every well-behaved CRITICAL_PLUS call fail, and for 10 s after
// they left (issue 55). A caller's stall must cost it its own calls, not
// everyone's: the well-behaved client is served throughout, and right
// after the attackers leave.
func TestIngressHoldsAgainstZeroWindowClients(t *testing.T) {
	up := grpcUpstream(t, &recorder{})
	ctl, err := admission.New(admission.WithTolerance(batchproxy.DefaultTolerance), admission.WithLimits(2, 4, admission.DefaultMaxLimit),
		admission.WithMaxWait(batchproxy.DefaultMaxWait))
	if err != nil {
		t.Fatal(err)
	}
	pol := trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32"}})
	in, err := triagesidecar.Ingress(up, triagesidecar.WithMiddleware(triagehttp.WithIntake(intake.WithTrust(pol)), triagehttp.WithAdmission(ctl)))
	if err != nil {
		t.Fatal(err)
	}
	addr := serveConns(t, in)
	client := testClient(t, addr)
	served := func(n int) int {
		ok := 0
		for range n {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			md := metadata.Pairs("triage-criticality", "CRITICAL_PLUS")
			if _, err := client.EmptyCall(metadata.NewOutgoingContext(ctx, md), &testgrpc.Empty{}); err == nil {
				ok++
			} else {
				t.Logf("failure: %v (%+v)", err, ctl.Stats())
			}
			cancel()
		}
		return ok
	}
	stop, err := h2attack.ZeroWindowGRPC(addr, "/grpc.testing.TestService/EmptyCall", 8, 30)
	if err != nil {
		t.Fatal(err)
	}
	if ok := served(50); ok < 50 {
		t.Errorf("beside 8 zero-window connections of 30 calls: %d of 50 CRITICAL_PLUS calls served (%+v)", ok, ctl.Stats())
	}
	stop()
	if ok := served(50); ok < 50 {
		t.Errorf("right after the attackers left: %d of 50 CRITICAL_PLUS calls served", ok)
	}
}

// serveConns is serve with triage's per-connection protection, as triage
// sidecar serves (triagehttp.ConnContext).
func serveConns(t *testing.T, h http.Handler) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, Protocols: new(http.Protocols), ConnContext: triagehttp.ConnContext}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return lis.Addr().String()
}

// An upgrade to h2c through the sidecar would turn its connection to the
// upstream into an HTTP/2 tunnel whose requests no admission sees: the
// sidecar forwards the request without the offer (it speaks HTTP/2 with
// prior knowledge itself), and the upstream answers it as HTTP/1.1.
func TestIngressDoesNotForwardAnH2CUpgrade(t *testing.T) {
	got := make(chan http.Header, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		io.WriteString(w, "ok")
	}))
	defer up.Close()
	in, err := triagesidecar.Ingress(mustURL(t, up.URL))
	if err != nil {
		t.Fatal(err)
	}
	resp, _, _ := rawRequest(t, serve(t, in), "GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n")
	resp.Body.Close()
	h := <-got
	if resp.StatusCode != 200 || h.Get("Upgrade") != "" || h.Get("Http2-Settings") != "" {
		t.Errorf("an h2c upgrade: %d, the upstream saw Upgrade %q, HTTP2-Settings %q", resp.StatusCode, h.Get("Upgrade"), h.Get("Http2-Settings"))
	}
}

// A WebSocket tunnel through the sidecar is admitted when it opens; then
// it waits on its two ends, and must not hold an execution slot for its
// life (issue 55): with one slot, a request beside an open tunnel is
// served.
func TestIngressTunnelHoldsNoSlot(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			io.WriteString(w, "plain")
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		brw.Flush()
		io.Copy(c, brw) // echo until the client goes
	}))
	defer up.Close()
	ctl, err := admission.New(admission.WithLimits(1, 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	in, err := triagesidecar.Ingress(mustURL(t, up.URL), triagesidecar.WithMiddleware(triagehttp.WithAdmission(ctl)))
	if err != nil {
		t.Fatal(err)
	}
	addr := serveConns(t, in)
	resp, c, br := rawRequest(t, addr, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("the tunnel did not open: %v", resp)
	}
	io.WriteString(c, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("through the tunnel: %q %v", buf, err)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	r2, err := client.Get("http://" + addr + "/plain")
	if err != nil {
		t.Fatalf("beside an open tunnel, with one slot: %v (%+v)", err, ctl.Stats())
	}
	body, _ := io.ReadAll(r2.Body)
	r2.Body.Close()
	if r2.StatusCode != 200 || string(body) != "plain" {
		t.Errorf("beside an open tunnel: %d %q (%+v)", r2.StatusCode, body, ctl.Stats())
	}
}

// A full-duplex gRPC call through the egress: the service sends a message
// and waits for the answer before it sends the next. Reading 64 KiB of
// the body ahead for retries deadlocked it (issue 55); the body is kept
// for a retry as it streams through instead.
func TestEgressBidiStream(t *testing.T) {
	up := grpcUpstream(t, echoStream{})
	pol, err := retry.New()
	if err != nil {
		t.Fatal(err)
	}
	caller, err := egress.New(egress.WithPolicy(pol), egress.WithInternal("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	eg, err := triagesidecar.Egress(up, caller)
	if err != nil {
		t.Fatal(err)
	}
	fullDuplex(t, serve(t, eg))
}

// greeter's streams speak first: a greeting, then an echo of each message.
type greeter struct {
	testgrpc.UnimplementedTestServiceServer
}

func (greeter) FullDuplexCall(s testgrpc.TestService_FullDuplexCallServer) error {
	if err := s.Send(&testgrpc.StreamingOutputCallResponse{Payload: &testgrpc.Payload{Body: []byte("hello")}}); err != nil {
		return err
	}
	return echoStream{}.FullDuplexCall(s)
}

// A gRPC stream whose server speaks first sends no message until it has
// heard from the server: waiting for that message answered it 408 after
// the message timeout and penalised its connection (issue 55). It goes
// through, and so does the next call on the same connection.
func TestIngressServerSpeaksFirst(t *testing.T) {
	up := grpcUpstream(t, greeter{})
	ctl, err := admission.New(admission.WithMessageTimeout(50 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	in, err := triagesidecar.Ingress(up, triagesidecar.WithMiddleware(triagehttp.WithAdmission(ctl)))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(serveConns(t, in), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	for call := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		stream, err := testgrpc.NewTestServiceClient(cc).FullDuplexCall(ctx)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil || string(resp.GetPayload().GetBody()) != "hello" {
			t.Fatalf("call %d: the server's greeting: %v, %v", call, resp, err)
		}
		if err := stream.Send(&testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: []byte("one")}}); err != nil {
			t.Fatal(err)
		}
		if resp, err := stream.Recv(); err != nil || string(resp.GetPayload().GetBody()) != "one" {
			t.Fatalf("call %d: the echo: %v, %v", call, resp, err)
		}
		stream.CloseSend()
		cancel()
	}
}

// Smuggling shapes sent raw to the sidecar, each carrying a second
// request where a lenient parser might take the first one's body to end:
// CL and TE together, two Content-Lengths, obs-fold, odd Transfer-Encodings,
// a GET with a body, pipelining. The sidecar parses each with net/http's
// strict parser and sends the upstream requests it framed itself: the
// upstream (one that reads bodies, as a sound server does) runs exactly
// the requests the caller got answers for, and a caller's triage key
// reaches it in none of them.
func TestIngressSmugglingShapes(t *testing.T) {
	smuggled := "GET /admin HTTP/1.1\r\nHost: x\r\nTriage-Criticality: SMUGGLED\r\n\r\n"
	shapes := map[string]string{
		"CL and TE":   "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled,
		"TE and CL":   "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 70\r\n\r\n0\r\n\r\n" + smuggled,
		"two CLs":     "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 70\r\n\r\n" + smuggled,
		"obs-fold":    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nX-Folded: a\r\n b\r\n\r\n" + smuggled,
		"TE xchunked": "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n" + smuggled,
		"TE space":    "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n" + smuggled,
		"GET body":    fmt.Sprintf("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(smuggled), smuggled),
		"pipelined":   "GET /one HTTP/1.1\r\nHost: x\r\n\r\nGET /two HTTP/1.1\r\nHost: x\r\n\r\n",
	}
	for name, raw := range shapes {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t, true)
			in, err := triagesidecar.Ingress(mustURL(t, "http://"+up.addr))
			if err != nil {
				t.Fatal(err)
			}
			addr := serve(t, in)
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			io.WriteString(c, raw)
			c.(*net.TCPConn).CloseWrite()
			br := bufio.NewReader(c)
			var codes []int
			for {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					break
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				codes = append(codes, resp.StatusCode)
			}
			for _, r := range up.requests() {
				if strings.Contains(r, "SMUGGLED") {
					t.Errorf("a caller's triage key reached the upstream: %q (answers %v)", r, codes)
				}
			}
			if len(up.requests()) != len(codes) && !(len(codes) == 1 && codes[0] >= 400) {
				t.Errorf("the upstream ran %d requests, the caller got %d answers: %q", len(up.requests()), len(codes), up.requests())
			}
			t.Logf("answers %v, upstream saw %q", codes, up.requests())
		})
	}
}

// rawRequest writes raw to a new connection to addr (closed when the test
// ends) and reads the first response; it returns the connection and its
// reader for what follows.
func rawRequest(t *testing.T, addr, raw string) (*http.Response, net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	io.WriteString(c, raw)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp, c, br
}

// echoAndEmpty is the echo stream with a unary EmptyCall beside it.
type echoAndEmpty struct{ echoStream }

func (echoAndEmpty) EmptyCall(context.Context, *testgrpc.Empty) (*testgrpc.Empty, error) {
	return &testgrpc.Empty{}, nil
}

// Streams that send one message and then nothing, and calls that send no
// message at all, hold no execution slot (issue 55): through the sidecar
// the handler waits on the upstream, which waits on the caller, so while
// the request's body is open and its read waits on the caller, the wait
// on the upstream is a wait on the caller too, and the request gives its
// slot back after the target delay. With one slot, a unary call beside
// three paused streams and three message-less calls is served (before:
// the first paused stream kept the slot, and the call timed out).
func TestIngressPausedStreamsHoldNoSlot(t *testing.T) {
	up := grpcUpstream(t, echoAndEmpty{})
	ctl, err := admission.New(admission.WithLimits(1, 1, 1), admission.WithMessageTimeout(40*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	in, err := triagesidecar.Ingress(up, triagesidecar.WithMiddleware(triagehttp.WithAdmission(ctl)))
	if err != nil {
		t.Fatal(err)
	}
	addr := serveConns(t, in)
	client := testClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 3 {
		pausedStream(t, ctx, client, i)
		loopback.WaitFor(t, fmt.Sprintf("paused stream %d stalled", i), func() bool { return ctl.Stats().Stalled == int64(i+1) })
	}
	stop, err := h2attack.MessagelessGRPC(addr, "/grpc.testing.TestService/EmptyCall", 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	loopback.WaitFor(t, "the message-less calls stalled", func() bool { return ctl.Stats().Stalled == 6 })
	cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
	defer ccancel()
	if _, err := client.EmptyCall(cctx, &testgrpc.Empty{}); err != nil {
		t.Fatalf("a call beside three paused streams and three message-less calls, one slot: %v (%+v)", err, ctl.Stats())
	}
}

// A request that would stall past its connection's bound on stalls is
// ended, not left holding its slot (issue 55: "a caller can hold at most
// its share of slots however it stalls"): with two stalls a connection
// and one slot, the third paused stream on a connection ends with an
// error, and a call beside it is served (before: the third kept the
// slot, and the call timed out).
func TestIngressStallPastTheBoundEnds(t *testing.T) {
	up := grpcUpstream(t, echoAndEmpty{})
	ctl, err := admission.New(admission.WithLimits(1, 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	in, err := triagesidecar.Ingress(up, triagesidecar.WithMiddleware(triagehttp.WithAdmission(ctl), triagehttp.WithIntake(intake.WithMaxConnStalls(2))))
	if err != nil {
		t.Fatal(err)
	}
	addr := serveConns(t, in)
	attacker, client := testClient(t, addr), testClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var third testgrpc.TestService_FullDuplexCallClient
	for i := range 3 {
		third = pausedStream(t, ctx, attacker, i)
		if i < 2 {
			loopback.WaitFor(t, fmt.Sprintf("paused stream %d stalled", i), func() bool { return ctl.Stats().Stalled == int64(i+1) })
		}
	}
	if _, err := third.Recv(); err == nil {
		t.Fatal("the stream past the connection's bound on stalls got an answer, want its end")
	}
	cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
	defer ccancel()
	if _, err := client.EmptyCall(cctx, &testgrpc.Empty{}); err != nil {
		t.Fatalf("a call beside two stalled streams and one past the bound, one slot: %v (%+v)", err, ctl.Stats())
	}
}

// pausedStream opens full-duplex call i, sends one message, reads its
// answer and sends nothing more.
func pausedStream(t *testing.T, ctx context.Context, c testgrpc.TestServiceClient, i int) testgrpc.TestService_FullDuplexCallClient {
	t.Helper()
	stream, err := c.FullDuplexCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&testgrpc.StreamingOutputCallRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("paused stream %d: its first answer: %v", i, err)
	}
	return stream
}
