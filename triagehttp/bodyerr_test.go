package triagehttp_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/triagehttp"
)

// Issue 38: an error reading the body ahead is the handler's to answer,
// as it would be without triage. Behind http.MaxBytesHandler a body over
// the limit reaches the handler as *http.MaxBytesError, which it answers
// 413, rather than an empty 200 from a handler that never ran.
func TestBodyReadAheadErrorsReachTheHandler(t *testing.T) {
	mw, _ := admittedMiddleware(t)
	srv := httptest.NewServer(http.MaxBytesHandler(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, "too large", http.StatusRequestEntityTooLarge)
			return
		}
		w.Write([]byte(strconv.Itoa(len(b))))
	})), 1<<10))
	defer srv.Close()
	for _, tc := range []struct {
		size int
		code int
		body string
	}{{100, http.StatusOK, "100"}, {100 << 10, http.StatusRequestEntityTooLarge, "too large\n"}} {
		resp, err := http.Post(srv.URL, "text/plain", strings.NewReader(strings.Repeat("x", tc.size)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || string(b) != tc.body {
			t.Errorf("a body of %d bytes behind MaxBytesHandler(1 KiB): %d %q, want %d %q", tc.size, resp.StatusCode, b, tc.code, tc.body)
		}
	}
}

// Issue 38: over HTTP/2 a body that does not come within the body
// timeout ends its own stream with 408, not the connection that other
// callers (a load balancer's) share: the next stream on it is served.
func TestSlowBodyOverHTTP2EndsOnlyItsStream(t *testing.T) {
	ctl, err := admission.New()
	if err != nil {
		t.Fatal(err)
	}
	mw, err := triagehttp.Middleware(triagehttp.WithAdmission(ctl), triagehttp.WithBodyTimeout(100*time.Millisecond, 0))
	if err != nil {
		t.Fatal(err)
	}
	addr := serveH2C(t, mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("ok"))
	})))
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	conn.Write([]byte(http2.ClientPreface))
	fr := http2.NewFramer(conn, conn)
	fr.WriteSettings()
	headers := func(id uint32, method string, end bool, extra ...string) {
		var hb bytes.Buffer
		enc := hpack.NewEncoder(&hb)
		fields := append([]string{":method", method, ":scheme", "http", ":authority", addr, ":path", "/"}, extra...)
		for i := 0; i < len(fields); i += 2 {
			enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndStream: end, EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
	}
	dec := hpack.NewDecoder(4096, nil)
	status := func(want uint32) string {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Fatalf("waiting for stream %d's answer: %v", want, err)
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					fr.WriteSettingsAck()
				}
			case *http2.GoAwayFrame:
				t.Fatalf("the server closed the shared connection (GOAWAY %v) waiting for stream %d", f.ErrCode, want)
			case *http2.HeadersFrame:
				fields, err := dec.DecodeFull(f.HeaderBlockFragment())
				if err != nil {
					t.Fatal(err)
				}
				if f.StreamID != want {
					continue
				}
				for _, h := range fields {
					if h.Name == ":status" {
						return h.Value
					}
				}
			}
		}
	}
	headers(1, "POST", false, "content-length", "10") // its body never comes
	if got := status(1); got != "408" {
		t.Fatalf("a body that never came: %s, want 408", got)
	}
	headers(3, "GET", true)
	if got := status(3); got != "200" {
		t.Fatalf("the next stream on the connection: %s, want 200", got)
	}
}
