package stockproxy

import (
	"context"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// held is an upstream that answers "/" at once and holds "/hold" until
// release is closed.
type held struct {
	addr    string
	release chan struct{}
	inside  chan struct{} // a value for every /hold that reached the upstream
}

func newHeld(t *testing.T) *held {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &held{addr: lis.Addr().String(), release: make(chan struct{}), inside: make(chan struct{}, 16)}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			h.inside <- struct{}{}
			<-h.release
		}
		w.Write([]byte("ok\n"))
	})}
	go srv.Serve(lis)
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(h.release) }); srv.Close() })
	return h
}

// start runs proxy with c (its Upstream, Listen and Dir filled in) and
// returns the address it listens on; the test skips when the proxy is not
// installed.
func start(t *testing.T, proxy string, c Config, up string) string {
	t.Helper()
	if _, err := exec.LookPath(proxy); err != nil {
		t.Skipf("%s is not installed", proxy)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.Listen = lis.Addr().String()
	lis.Close()
	c.Upstream, c.Dir = up, t.TempDir()
	argv, err := Argv(proxy, c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cancel()
		cmd.Wait()
	})
	for i := 0; ; i++ {
		if conn, err := net.Dial("tcp", c.Listen); err == nil {
			conn.Close()
			return c.Listen
		}
		if i == 500 {
			t.Fatalf("%s never listened on %s:\n%s", proxy, c.Listen, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// status sends GET path with criticality and returns the status.
func httpStatus(t *testing.T, addr, path string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
	req.Header.Set("Triage-Criticality", "CRITICAL")
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// hold sends n requests to /hold and waits until the upstream holds them.
func hold(t *testing.T, addr string, up *held, n int) {
	t.Helper()
	for range n {
		go func() { // its answer comes when the test ends, or never
			resp, err := http.Get("http://" + addr + "/hold")
			if err == nil {
				resp.Body.Close()
			}
		}()
		select {
		case <-up.inside:
		case <-time.After(10 * time.Second):
			t.Fatal("a held request never reached the upstream")
		}
	}
}

// nginx's limit_conn refuses what passes its bound with 503 at once (the
// zone's key is not empty: with an empty $server_name nginx counted
// nothing and forwarded every request).
func TestNginxLimitsConnections(t *testing.T) {
	up := newHeld(t)
	addr := start(t, "nginx", Config{Conns: 2}, up.addr)
	hold(t, addr, up, 2)
	if got := httpStatus(t, addr, "/"); got != http.StatusServiceUnavailable {
		t.Errorf("a third request beside two held, limit_conn 2: %d, want 503", got)
	}
}

// nginx's limit_req refuses past its rate and burst.
func TestNginxLimitsRate(t *testing.T) {
	up := newHeld(t)
	addr := start(t, "nginx", Config{Rate: 1, Burst: 1, Conns: 100}, up.addr)
	codes := map[int]int{}
	for range 5 {
		codes[httpStatus(t, addr, "/")]++
	}
	if codes[http.StatusOK] != 2 || codes[http.StatusServiceUnavailable] != 3 {
		t.Errorf("five requests at once at 1/s with a burst of 1: %v, want two 200 and three 503", codes)
	}
}

// HAProxy holds a request past maxconn in its queue for the queue timeout
// and then answers 503.
func TestHAProxyQueuesThenRefuses(t *testing.T) {
	up := newHeld(t)
	addr := start(t, "haproxy", Config{Maxconn: 1, Queue: 200 * time.Millisecond}, up.addr)
	hold(t, addr, up, 1)
	begin := time.Now()
	if got := httpStatus(t, addr, "/"); got != http.StatusServiceUnavailable {
		t.Errorf("a second request beside one held, maxconn 1: %d, want 503", got)
	}
	if waited := time.Since(begin); waited < 150*time.Millisecond {
		t.Errorf("refused after %v, want the queue's 200ms first", waited)
	}
}

func TestArgvRefusesBadInput(t *testing.T) {
	if _, err := Argv("envoy", Config{Upstream: "a:1", Listen: "b:2", Dir: t.TempDir()}); err == nil {
		t.Error("an unknown proxy: no error")
	}
	if _, err := Argv("nginx", Config{Listen: "b:2", Dir: t.TempDir()}); err == nil {
		t.Error("no upstream: no error")
	}
}
