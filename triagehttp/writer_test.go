package triagehttp_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/triagehttp"
)

// Writers with each combination of the optional interfaces a
// ResponseWriter may have.
// baseWriter has a ResponseWriter's methods and no other (the recorder
// it writes to is a Flusher).
type baseWriter struct{ rec *httptest.ResponseRecorder }

func (w baseWriter) Header() http.Header         { return w.rec.Header() }
func (w baseWriter) Write(p []byte) (int, error) { return w.rec.Write(p) }
func (w baseWriter) WriteHeader(code int)        { w.rec.WriteHeader(code) }

var errFlush = errors.New("client gone")

type flushErrorWriter struct{ baseWriter }

func (flushErrorWriter) Flush()            {}
func (flushErrorWriter) FlushError() error { return errFlush }

type hijackWriter struct{ baseWriter }

func (hijackWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) { return nil, nil, nil }

type readerFromWriter struct{ baseWriter }

func (w readerFromWriter) ReadFrom(r io.Reader) (int64, error) { return io.Copy(w.rec, r) }

type pusherWriter struct{ baseWriter }

func (pusherWriter) Push(string, *http.PushOptions) error { return nil }

type allWriter struct{ baseWriter }

func (allWriter) Flush()                                       {}
func (allWriter) FlushError() error                            { return errFlush }
func (allWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) { return nil, nil, nil }
func (w allWriter) ReadFrom(r io.Reader) (int64, error)        { return io.Copy(w.rec, r) }
func (allWriter) Push(string, *http.PushOptions) error         { return nil }

// Issue 38: under admission control the handler's ResponseWriter has
// every optional interface the server's has, and only those; a flush
// through http.ResponseController returns the server's error, so an
// event stream learns that its client left.
func TestWriterKeepsTheServersInterfaces(t *testing.T) {
	mw, ctl := admittedMiddleware(t)
	for _, tc := range []struct {
		name                                  string
		w                                     func(baseWriter) http.ResponseWriter
		flush, hijack, readFrom, push, errors bool
	}{
		{"plain", func(b baseWriter) http.ResponseWriter { return b }, false, false, false, false, false},
		{"flusher", func(b baseWriter) http.ResponseWriter { return flushErrorWriter{b} }, true, false, false, false, true},
		{"hijacker", func(b baseWriter) http.ResponseWriter { return hijackWriter{b} }, false, true, false, false, false},
		{"readerfrom", func(b baseWriter) http.ResponseWriter { return readerFromWriter{b} }, false, false, true, false, false},
		{"pusher", func(b baseWriter) http.ResponseWriter { return pusherWriter{b} }, false, false, false, true, false},
		{"all", func(b baseWriter) http.ResponseWriter { return allWriter{b} }, true, true, true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			server := tc.w(baseWriter{rec})
			ran := false
			h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ran = true
				_, flush := w.(http.Flusher)
				_, hijack := w.(http.Hijacker)
				_, readFrom := w.(io.ReaderFrom)
				_, push := w.(http.Pusher)
				if flush != tc.flush || hijack != tc.hijack || readFrom != tc.readFrom || push != tc.push {
					t.Errorf("the handler's writer: Flusher %v, Hijacker %v, ReaderFrom %v, Pusher %v; want %v, %v, %v, %v",
						flush, hijack, readFrom, push, tc.flush, tc.hijack, tc.readFrom, tc.push)
				}
				if readFrom {
					w.(io.ReaderFrom).ReadFrom(strings.NewReader(strings.Repeat("x", 8<<10)))
				}
				err := http.NewResponseController(w).Flush()
				switch {
				case tc.errors && !errors.Is(err, errFlush):
					t.Errorf("Flush through ResponseController: %v, want the server's %v", err, errFlush)
				case !tc.flush && !errors.Is(err, http.ErrNotSupported):
					t.Errorf("Flush of a writer that cannot: %v, want ErrNotSupported", err)
				}
			}))
			h.ServeHTTP(server, httptest.NewRequest("GET", "/", nil))
			if !ran {
				t.Fatalf("the handler did not run: %d %s", rec.Code, rec.Body)
			}
			if st := ctl.Stats(); st.Executing != 0 || st.Stalled != 0 {
				t.Fatalf("after the request: %+v", st)
			}
		})
	}
}

// The same over net/http's own servers, HTTP/1.1 and HTTP/2: their
// writers' interfaces are kept (HTTP/1.1: Hijacker and ReaderFrom;
// HTTP/2: Pusher), and a flush reaches the client.
func TestWriterKeepsNetHTTPsInterfaces(t *testing.T) {
	mw, _ := admittedMiddleware(t)
	type shape struct{ flush, hijack, readFrom, push bool }
	got := make(chan shape, 1)
	addr := serveH2C(t, mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var s shape
		_, s.flush = w.(http.Flusher)
		_, s.hijack = w.(http.Hijacker)
		_, s.readFrom = w.(io.ReaderFrom)
		_, s.push = w.(http.Pusher)
		got <- s
		w.Write([]byte("ok"))
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("flush: %v", err)
		}
	})))
	for _, tc := range []struct {
		name string
		h2   bool
		want shape
	}{
		{"HTTP/1.1", false, shape{flush: true, hijack: true, readFrom: true}},
		{"HTTP/2", true, shape{flush: true, push: true}},
	} {
		tr := &http.Transport{Protocols: new(http.Protocols)}
		tr.Protocols.SetHTTP1(!tc.h2)
		tr.Protocols.SetUnencryptedHTTP2(tc.h2)
		resp, err := (&http.Client{Transport: tr}).Get("http://" + addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		tr.CloseIdleConnections()
		if s := <-got; s != tc.want || string(b) != "ok" || resp.ProtoMajor != map[bool]int{false: 1, true: 2}[tc.h2] {
			t.Errorf("%s: the handler's writer %+v, answer %q over HTTP/%d; want %+v", tc.name, s, b, resp.ProtoMajor, tc.want)
		}
	}
}

// admittedMiddleware returns the middleware under admission control with
// a Controller made with opts.
func admittedMiddleware(t *testing.T, opts ...admission.Option) (func(http.Handler) http.Handler, *admission.Controller) {
	t.Helper()
	ctl, err := admission.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := triagehttp.Middleware(triagehttp.WithAdmission(ctl))
	if err != nil {
		t.Fatal(err)
	}
	return mw, ctl
}
