package triagehttp_test

import (
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/triagehttp"
)

// h2cClient returns a client speaking unencrypted HTTP/2 (prior
// knowledge) over a connection of its own.
func h2cClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// HTTP/2 served by net/http gets the connection policy gRPC streams get
// (intake.Conn, bound with ConnContext): a request whose body did not
// come within the body timeout is answered 408 and penalises its
// connection, whose next requests are refused at arrival, paced, without
// their handler, while another connection and the same connection's
// health checks are served; after the penalty, the connection is served
// again, on probation.
func TestSlowSenderPenaltyOverHTTP2(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	ctl, err := admission.New(admission.WithClock(f), admission.WithLimits(8, 8, 8),
		admission.WithInterval(time.Hour), admission.WithMessageTimeout(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := triagehttp.Middleware(triagehttp.WithAdmission(ctl), triagehttp.WithHealthCheck("/healthz"),
		triagehttp.WithBodyTimeout(50*time.Millisecond, 0))
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int64
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ConnContext: triagehttp.ConnContext, Protocols: new(http.Protocols),
		Handler: mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran.Add(1)
			io.Copy(io.Discard, r.Body)
		}))}
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	url := "http://" + lis.Addr().String()

	slow, other := h2cClient(t), h2cClient(t)
	get := func(c *http.Client, path string) *http.Response {
		t.Helper()
		resp, err := c.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Fatalf("%s over HTTP/%d", path, resp.ProtoMajor)
		}
		return resp
	}
	get(slow, "/warm") // the connection is up
	pr, pw := io.Pipe()
	defer pw.Close()
	req, _ := http.NewRequest("POST", url+"/upload", pr)
	req.ContentLength = 10
	resp, err := slow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("a body that never came: %d, want 408", resp.StatusCode)
	}
	before := ran.Load()
	if resp := get(slow, "/next"); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Triage-Outcome") != "task-overloaded" {
		t.Fatalf("the slow sender's next request: %d %q, want 503 task-overloaded", resp.StatusCode, resp.Header.Get("Triage-Outcome"))
	}
	if n := ran.Load() - before; n != 0 {
		t.Fatalf("%d handlers ran for a penalised connection's request", n)
	}
	if resp := get(other, "/next"); resp.StatusCode != http.StatusOK {
		t.Fatalf("another connection: %d", resp.StatusCode)
	}
	if resp := get(slow, "/healthz"); resp.StatusCode != http.StatusOK {
		t.Fatalf("the slow sender's health check: %d", resp.StatusCode)
	}

	// The next refusal waits for the pace, on the clock.
	pending := f.Pending()
	done := make(chan struct{})
	var paced *http.Response
	go func() {
		defer close(done)
		paced, _ = slow.Get(url + "/paced")
	}()
	if !f.BlockUntil(pending+1, done) {
		t.Fatalf("a second refusal came at once: %v", paced)
	}
	f.Advance(intake.SlowSenderPace)
	<-done
	if paced == nil || paced.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("the paced refusal: %v", paced)
	}
	paced.Body.Close()

	f.Advance(intake.DefaultSlowSenderPenalty)
	if resp := get(slow, "/after"); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the penalty: %d", resp.StatusCode)
	}
	if s := ctl.Stats(); s.Executing != 0 || s.Pending != 0 {
		t.Fatalf("after: %+v", s)
	}
}
