package triagehttp_test

import (
	"bytes"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/triagehttp"
)

// serveH2C serves h over HTTP/1.1 and unencrypted HTTP/2 (prior
// knowledge) on a loopback port until the test ends, and returns the
// address.
func serveH2C(t *testing.T, h http.Handler) string {
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

// zeroWindowRequest opens an HTTP/2 connection to addr that grants no
// flow-control window (SETTINGS_INITIAL_WINDOW_SIZE = 0) and sends a GET
// of path on it, then reads and drops the server's frames until the
// connection closes.
func zeroWindowRequest(t *testing.T, addr, path string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", addr}, {":path", path}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
				fr.WriteSettingsAck()
			}
		}
	}()
}

// Issue 38: an HTTP/2 client that opens no flow-control window blocks the
// handler's first write past the server's 4 KiB buffer, and its flush.
// That wait is on the client: it stalls, and with a single execution
// slot the next request is served.
func TestZeroWindowClientHoldsNoSlot(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	ctl, err := admission.New(admission.WithClock(f), admission.WithLimits(1, 1, 1),
		admission.WithInterval(time.Hour), admission.WithMaxWait(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := triagehttp.Middleware(triagehttp.WithAdmission(ctl), triagehttp.WithIntake(intake.WithClock(f)))
	if err != nil {
		t.Fatal(err)
	}
	addr := serveH2C(t, mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/events" {
			w.Write(make([]byte, 8<<10))
			http.NewResponseController(w).Flush()
			return
		}
		w.Write([]byte("ok"))
	})))
	s := &clientWaitServer{f: f, ctl: ctl, url: "http://" + addr}
	zeroWindowRequest(t, addr, "/events")
	s.stall(t)
	s.served(t, "an HTTP/2 client with no flow-control window")
}
