package triagehttp_test

import (
	"bufio"
	"context"
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
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/testkit/loopback"
	"github.com/triagehq/triage/triagehttp"
)

// clientWaitServer serves, with one execution slot and admission control
// on a fake clock: /big, 64 MiB written in 64 KiB pieces, more than
// loopback's socket buffers hold; /upload, which reads its whole body;
// and /, a short answer.
type clientWaitServer struct {
	f       *clock.Fake
	ctl     *admission.Controller
	srv     *httptest.Server
	url     string // the server's, for served
	written atomic.Int64
	read    atomic.Int64
}

func startClientWaitServer(t *testing.T) *clientWaitServer {
	t.Helper()
	s := &clientWaitServer{f: clock.NewFake(time.Unix(0, 0))}
	var err error
	s.ctl, err = admission.New(admission.WithClock(s.f), admission.WithLimits(1, 1, 1),
		admission.WithInterval(time.Hour), admission.WithMaxWait(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := triagehttp.Middleware(triagehttp.WithAdmission(s.ctl), triagehttp.WithIntake(intake.WithClock(s.f)))
	if err != nil {
		t.Fatal(err)
	}
	piece := make([]byte, 64<<10)
	s.srv = httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			for range 1024 {
				n, err := w.Write(piece)
				s.written.Add(int64(n))
				if err != nil {
					return
				}
			}
			w.(http.Flusher).Flush()
		case "/upload":
			n, err := io.Copy(io.Discard, r.Body)
			s.read.Add(n)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			fmt.Fprintf(w, "%d bytes", n)
		default:
			fmt.Fprint(w, "ok")
		}
	})))
	t.Cleanup(s.srv.Close)
	s.url = s.srv.URL
	return s
}

// stall moves the fake clock on by the target delay, as time would pass,
// until the one request is stalled on its client and none holds room.
func (s *clientWaitServer) stall(t *testing.T) {
	t.Helper()
	loopback.WaitFor(t, "the handler to stall on its client", func() bool {
		if st := s.ctl.Stats(); st.Stalled == 1 && st.Executing == 0 && st.Pending == 0 {
			return true
		}
		s.f.Advance(s.ctl.TargetDelay())
		return false
	})
}

// served checks that a request from another client is served while the
// slot's holder waits on its own client, the fake clock moving on
// meanwhile. Without the stall it waits for the slot (an hour of the
// fake clock) until its real deadline.
func (s *clientWaitServer) served(t *testing.T, who string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", s.url+"/", nil)
	type result struct {
		code int
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- result{0, err}
			return
		}
		resp.Body.Close()
		done <- result{resp.StatusCode, nil}
	}()
	var got result
	loopback.WaitFor(t, "the request beside "+who, func() bool {
		select {
		case got = <-done:
			return true
		default:
			s.f.Advance(s.ctl.TargetDelay())
			return false
		}
	})
	if got.err != nil || got.code != http.StatusOK {
		t.Fatalf("a request beside %s: %d, %v; want it served", who, got.code, got.err)
	}
}

func (s *clientWaitServer) idle(t *testing.T) {
	t.Helper()
	loopback.WaitFor(t, "every request to end", func() bool {
		st := s.ctl.Stats()
		return st.Executing == 0 && st.Stalled == 0 && st.Pending == 0 && st.Queued == 0
	})
}

// A client that does not read its response holds its connection, not the
// task: once the handler's write has blocked for the target delay, the
// slot serves other requests. When the client reads, the whole response
// comes.
func TestSlowReaderOverHTTPGivesItsSlotBack(t *testing.T) {
	s := startClientWaitServer(t)
	c, err := net.Dial("tcp", s.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
	s.stall(t)
	s.served(t, "a response its client does not read")
	if n := s.written.Load(); n >= 64<<20 {
		t.Fatalf("the handler wrote all %d bytes unread", n)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || n != 64<<20 {
		t.Fatalf("read %d bytes of the response (%v), want %d", n, err, 64<<20)
	}
	s.idle(t)
}

// A client that sends part of a large body and stops holds no slot while
// the handler waits for the rest; the upload completes when it sends it.
func TestSlowBodyPastTheBufferGivesItsSlotBack(t *testing.T) {
	s := startClientWaitServer(t)
	c, err := net.Dial("tcp", s.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const size = 1 << 20
	first := triagehttp.DefaultBodyBuffer + 100<<10 // past what the middleware reads ahead
	fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", size, strings.Repeat("x", first))
	loopback.WaitFor(t, "the handler to read the body's first part", func() bool { return s.read.Load() > 0 || s.ctl.Stats().Executing == 1 })
	s.stall(t)
	s.served(t, "a body its client stopped sending")
	fmt.Fprint(c, strings.Repeat("x", size-first))
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != fmt.Sprintf("%d bytes", size) {
		t.Fatalf("the upload after the stall: %d %q", resp.StatusCode, b)
	}
	s.idle(t)
}
