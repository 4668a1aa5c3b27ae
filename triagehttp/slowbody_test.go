package triagehttp_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/triagehttp"
)

// Slow senders over HTTP (issue 20): clients that send their headers and
// not their body hold no execution slot, so a well-behaved request beside
// fifty of them is served at once by a task with a single slot; each of
// them is answered 408 once the body timeout has passed, and no handler
// runs for them.
func TestSlowBodiesHoldNoSlot(t *testing.T) {
	ctl, err := admission.New(admission.WithLimits(1, 1, 1), admission.WithMessageTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := triagehttp.Middleware(triagehttp.WithAdmission(ctl), triagehttp.WithBodyTimeout(100*time.Millisecond, 0))
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int64
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d bytes", len(b))
	})))
	defer srv.Close()

	var slow []net.Conn
	for i := 0; i < 50; i++ {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
		slow = append(slow, c)
	}
	resp, err := http.Post(srv.URL, "text/plain", strings.NewReader(strings.Repeat("x", 100<<10)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "102400 bytes" {
		t.Fatalf("a request beside 50 slow bodies: %d %q", resp.StatusCode, body)
	}
	for i, c := range slow {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("slow body %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("slow body %d: %d, want 408", i, resp.StatusCode)
		}
	}
	if n := ran.Load(); n != 1 {
		t.Fatalf("%d handlers ran, want 1 (the well-behaved request)", n)
	}
	if s := ctl.Stats(); s.Executing != 0 || s.Pending != 0 {
		t.Fatalf("after: %+v", s)
	}
	if _, err := triagehttp.Middleware(triagehttp.WithBodyBuffer(-1)); err == nil {
		t.Error("a negative body buffer accepted")
	}
}

// A body on a slow link (issue 55): ten bytes in five pieces, the last
// well past the message timeout, is read ahead while the request holds no
// slot and served, not answered 408; a request beside it is served by a
// task with one slot meanwhile. A body that stops coming is still
// answered 408, once the body timeout and its allowance for what came
// have passed, without its handler running.
func TestSlowLinkBodyIsServed(t *testing.T) {
	ctl, err := admission.New(admission.WithLimits(1, 1, 1), admission.WithMessageTimeout(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := triagehttp.Middleware(triagehttp.WithAdmission(ctl), triagehttp.WithBodyTimeout(time.Second, 1000))
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int64
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%q", b)
	})))
	defer srv.Close()

	slow, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	fmt.Fprintf(slow, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01")
	beside, err := http.Post(srv.URL, "text/plain", strings.NewReader("beside"))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(beside.Body)
	beside.Body.Close()
	if beside.StatusCode != http.StatusOK || string(got) != `"beside"` {
		t.Fatalf("a request beside a body on a slow link: %d %q", beside.StatusCode, got)
	}
	tick := time.NewTicker(25 * time.Millisecond) // 4 pieces: 100 ms, five message timeouts
	defer tick.Stop()
	for _, piece := range []string{"23", "45", "67", "89"} {
		<-tick.C
		slow.Write([]byte(piece))
	}
	slow.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(slow), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(got) != `"0123456789"` {
		t.Fatalf("a body on a slow link: %d %q, want 200 and the body", resp.StatusCode, got)
	}

	stops, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer stops.Close()
	fmt.Fprintf(stops, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")
	stops.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err = http.ReadResponse(bufio.NewReader(stops), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("a body that stops: %d, want 408", resp.StatusCode)
	}
	if n := ran.Load(); n != 2 {
		t.Fatalf("%d handlers ran, want 2 (the slow link's and the one beside it)", n)
	}
	if _, err := triagehttp.Middleware(triagehttp.WithBodyTimeout(-time.Second, 500)); err == nil {
		t.Error("a negative body timeout accepted")
	}
	if _, err := triagehttp.Middleware(triagehttp.WithBodyTimeout(time.Second, -1)); err == nil {
		t.Error("a negative minimum rate accepted")
	}
}
