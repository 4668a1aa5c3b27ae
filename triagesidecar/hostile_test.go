package triagesidecar_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/triagehq/triage/triagesidecar"
)

// naiveUpstream is an HTTP/1.1 keep-alive server that, as Python's
// http.server does for a GET, never reads a request's body: whatever the
// body holds is parsed as the next request on the connection. It records
// each request line with its Triage-Criticality header.
type naiveUpstream struct {
	addr string
	mu   sync.Mutex
	seen []string
}

func startNaiveUpstream(t *testing.T) *naiveUpstream {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	u := &naiveUpstream{addr: lis.Addr().String()}
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
		crit, closing := "", false
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
			}
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
