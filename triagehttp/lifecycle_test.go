package triagehttp_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/triagehttp"
)

// An HTTP server in lame duck answers its health endpoint 503 (even when
// admission refuses everything else), marks every response, closes its
// idle keep-alive connections so that clients reconnect elsewhere, and
// serves again when Ready.
func TestHTTPLameDuck(t *testing.T) {
	l, err := lifecycle.New()
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := admission.New(admission.WithSignal(fixedSignal(10), admission.DefaultThresholds()))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := triagehttp.Middleware(triagehttp.WithLifecycle(l), triagehttp.WithHealthCheck("/healthz", "/livez"), triagehttp.WithAdmission(ctl))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/healthz", triagehttp.HealthHandler(l))
	mux.Handle("/livez", triagehttp.LivenessHandler())
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {})
	srv := &http.Server{Handler: mw(mux)}
	stop := triagehttp.Announce(l, srv)
	defer stop()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	get := func(path string) (*http.Response, bool) {
		t.Helper()
		reused := false
		req, _ := http.NewRequest("GET", "http://"+lis.Addr().String()+path, nil)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
		}))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp, reused
	}
	if resp, _ := get("/healthz"); resp.StatusCode != 200 || resp.Header.Get("Triage-Lame-Duck") != "" {
		t.Fatalf("serving: health %s, lame duck header %q", resp.Status, resp.Header.Get("Triage-Lame-Duck"))
	}
	if resp, _ := get("/work"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("admission at 10x its signal's target let a request through: %s", resp.Status)
	}
	if _, reused := get("/healthz"); !reused {
		t.Fatal("the client did not keep its connection alive while the server serves")
	}
	l.EnterLameDuck()
	resp, reused := get("/healthz")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Triage-Lame-Duck") != "1" {
		t.Errorf("lame duck: health %s, lame duck header %q; want 503 and 1", resp.Status, resp.Header.Get("Triage-Lame-Duck"))
	}
	if resp, _ := get("/livez"); resp.StatusCode != 200 {
		t.Errorf("lame duck, admission refusing everything: liveness %s, want 200", resp.Status)
	}
	if reused {
		t.Error("in lame duck, the idle keep-alive connection was reused: it should have been closed")
	}
	if _, reused := get("/healthz"); reused {
		t.Error("in lame duck, a connection was kept alive after its response")
	}
	l.Ready()
	if resp, _ := get("/healthz"); resp.StatusCode != 200 {
		t.Errorf("Ready: health %s", resp.Status)
	}
	if _, reused := get("/healthz"); !reused {
		t.Error("Ready: keep-alives did not resume")
	}
}

// Shutdown stops a server whose handler never returns once its context
// ends, instead of waiting for it forever.
func TestHTTPShutdownBounded(t *testing.T) {
	l, _ := lifecycle.New(lifecycle.WithDrain(0))
	entered := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done() // holds the request until the connection closes
	})}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	callErr := make(chan error, 1)
	go func() {
		resp, err := http.Get("http://" + lis.Addr().String() + "/hang")
		if err == nil {
			resp.Body.Close()
		}
		callErr <- err
	}()
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	shut := make(chan error, 1)
	go func() { shut <- l.Shutdown(ctx, triagehttp.Shutdown(srv)) }()
	cancel()
	if err := <-shut; !errors.Is(err, context.Canceled) {
		t.Errorf("Shutdown = %v, want context.Canceled", err)
	}
	if err := <-callErr; err == nil {
		t.Error("the hanging request completed: the server was not stopped hard")
	}
}

type fixedSignal float64

func (fixedSignal) Name() string           { return "fixed" }
func (s fixedSignal) Utilization() float64 { return float64(s) }
