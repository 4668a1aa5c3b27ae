package triagehttp

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/felixge/httpsnoop"
	"github.com/petermattis/goid"

	"github.com/triagehq/triage/intake"
)

// clientIO is a request's writer and body under admission control: a
// write, flush or read that may wait on the client (a client that does
// not read its response, or sends its body slowly) tells the request's
// Handle (intake.Handle.ClientWait), so that once it has waited the
// target delay the request gives its execution slot back until the wait
// ends.
type clientIO struct {
	w clientWriter
	b clientBody
}

// EndClientWaits ends the request's waits on its client when it may not
// stall (intake.Handle.EndWith: its connection or the task holds as many
// stalled requests as it may): its body's reads and its writes fail at
// once (read and write deadlines in the past), so that its handler
// returns rather than keep its execution slot while the client sends or
// reads nothing. A hijacked connection keeps its slot.
func (c *clientIO) EndClientWaits() {
	rc := http.NewResponseController(c.w.rw)
	past := time.Unix(1, 0)
	rc.SetReadDeadline(past)
	rc.SetWriteDeadline(past)
}

// onClient wraps w, and r's body unless the middleware read all of it
// ahead (whole). The wrapped writer has exactly the optional interfaces
// w has (http.Flusher and FlushError, http.Hijacker, io.ReaderFrom,
// http.Pusher, io.StringWriter, http.CloseNotifier, the deadlines and
// full duplex), and unwraps to it: net/http's own HTTP/1.x and HTTP/2
// writers get a wrapper of their shape with no allocation of its own;
// any other writer goes through httpsnoop.Wrap.
func onClient(w http.ResponseWriter, r *http.Request, h *intake.Handle, whole bool) (http.ResponseWriter, *http.Request) {
	owner := goid.Get()
	c := &clientIO{w: clientWriter{rw: w, h: h}}
	if !whole && hasBody(r) {
		c.b = clientBody{ReadCloser: r.Body, h: h, owner: owner}
		r.Body = &c.b
	}
	h.EndWith(c)
	switch shapeOf(w) {
	case http1Shape:
		return http1Writer{netWriter{&c.w}}, r
	case http2Shape:
		return http2Writer{netWriter{&c.w}}, r
	}
	return httpsnoop.Wrap(w, httpsnoop.Hooks{
		Write:       func(httpsnoop.WriteFunc) httpsnoop.WriteFunc { return c.w.write },
		WriteString: func(httpsnoop.WriteStringFunc) httpsnoop.WriteStringFunc { return c.w.writeString },
		ReadFrom:    func(httpsnoop.ReadFromFunc) httpsnoop.ReadFromFunc { return c.w.readFrom },
		Flush:       func(httpsnoop.FlushFunc) httpsnoop.FlushFunc { return func() { c.w.flushError() } },
		FlushError:  func(httpsnoop.FlushErrorFunc) httpsnoop.FlushErrorFunc { return c.w.flushError },
	}), r
}

// unblockedResponse is how much of a response a handler writes before its
// writes may wait on the client: what net/http buffers ahead of the
// connection whatever the client does (2 KiB before HTTP/1.1 chunking;
// HTTP/2 buffers 4 KiB, then waits for the client's flow-control
// window, which a client may leave at 0). Shorter responses, most of
// them, skip ClientWait; every flush, and every write past it, waits.
const unblockedResponse = 2 << 10

// clientWriter is what the handler's ResponseWriter does beyond the
// server's: it waits on the client. A ResponseWriter is used by one
// goroutine at a time; the body may be read on another (full duplex).
type clientWriter struct {
	rw      http.ResponseWriter // the server's
	h       *intake.Handle
	written int
}

// wait runs f as a wait on the client. A ResponseWriter is used by one
// goroutine at a time, so its waits are the handler's own whichever
// goroutine makes them (a reverse proxy flushes from a timer's): a
// goroutine that flushed once and went away must not keep the request
// from stalling on a client that reads nothing.
func (w *clientWriter) wait(f func() error) error {
	w.h.ClientWait(intake.Own)
	err := f()
	w.h.ClientResume(intake.Own)
	return err
}

func (w *clientWriter) write(p []byte) (n int, err error) {
	if w.written += len(p); w.written <= unblockedResponse {
		return w.rw.Write(p)
	}
	err = w.wait(func() error { n, err = w.rw.Write(p); return err })
	return n, err
}

func (w *clientWriter) writeString(p string) (n int, err error) {
	if w.written += len(p); w.written <= unblockedResponse {
		return io.WriteString(w.rw, p)
	}
	err = w.wait(func() error { n, err = io.WriteString(w.rw, p); return err })
	return n, err
}

// readFrom copies src into the response. Only its writes wait on the
// client: a source that makes the handler wait (a pipe, an upstream's
// body) is the handler's own business, and the request keeps its slot
// and is charged while it waits. A source that never waits (a regular
// file, bytes in memory) goes through the server's ReadFrom whole, as a
// wait on the client, so that a file is still sent with sendfile.
func (w *clientWriter) readFrom(src io.Reader) (n int64, err error) {
	if readsAtOnce(src) {
		err = w.wait(func() error { n, err = w.rw.(io.ReaderFrom).ReadFrom(src); return err })
		w.written += int(min(n, 1<<30))
		return n, err
	}
	bp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bp)
	for {
		nr, er := src.Read(*bp)
		if nr > 0 {
			nw, ew := w.write((*bp)[:nr])
			n += int64(nw)
			if ew != nil {
				return n, ew
			}
		}
		if er == io.EOF {
			return n, nil
		}
		if er != nil {
			return n, er
		}
	}
}

// readsAtOnce reports whether reading src never waits: a regular file,
// or bytes in memory.
func readsAtOnce(src io.Reader) bool {
	switch s := src.(type) {
	case *bytes.Reader, *strings.Reader, *bytes.Buffer:
		return true
	case *os.File:
		fi, err := s.Stat()
		return err == nil && fi.Mode().IsRegular()
	}
	return false
}

// copyBuffers are readFrom's buffers, 32 KiB as io.Copy's.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// flushError flushes through http.ResponseController, which returns the
// server's error (FlushError) where it has one.
func (w *clientWriter) flushError() error {
	return w.wait(http.NewResponseController(w.rw).Flush)
}

// The shapes of net/http's own writers: the optional interfaces they
// have, exactly.
type writerShape uint8

const (
	otherShape writerShape = iota
	http1Shape             // HTTP/1.x: Hijacker and ReaderFrom, no Pusher
	http2Shape             // HTTP/2: Pusher, no Hijacker nor ReaderFrom
)

type (
	flushErrorer interface{ FlushError() error }
	deadliner    interface {
		SetReadDeadline(time.Time) error
		SetWriteDeadline(time.Time) error
	}
	fullDuplexer interface{ EnableFullDuplex() error }
)

// netHTTP1 and netHTTP2 are the method sets of net/http's writers.
type (
	netCommon interface {
		http.ResponseWriter
		http.Flusher
		flushErrorer
		io.StringWriter
		http.CloseNotifier //nolint:staticcheck // the server's writers have it
		deadliner
		fullDuplexer
	}
	netHTTP1 interface {
		netCommon
		http.Hijacker
		io.ReaderFrom
	}
	netHTTP2 interface {
		netCommon
		http.Pusher
	}
)

// shapeOf says which of net/http's writers w has the shape of, exactly.
func shapeOf(w http.ResponseWriter) writerShape {
	if _, ok := w.(netHTTP1); ok {
		if _, pu := w.(http.Pusher); !pu {
			return http1Shape
		}
		return otherShape
	}
	if _, ok := w.(netHTTP2); ok {
		_, hj := w.(http.Hijacker)
		_, rf := w.(io.ReaderFrom)
		if !hj && !rf {
			return http2Shape
		}
	}
	return otherShape
}

// netWriter is the wrapper of net/http's writers: their common methods,
// the waits on the client added. A struct of one pointer, it is stored
// in an interface without an allocation.
type netWriter struct{ *clientWriter }

func (n netWriter) Header() http.Header { return n.rw.Header() }

func (n netWriter) Write(p []byte) (int, error) { return n.write(p) }

func (n netWriter) WriteString(s string) (int, error) { return n.writeString(s) }

func (n netWriter) WriteHeader(code int) { n.rw.WriteHeader(code) }

func (n netWriter) Flush() { n.flushError() }

func (n netWriter) FlushError() error { return n.flushError() }

func (n netWriter) SetReadDeadline(t time.Time) error { return n.rw.(deadliner).SetReadDeadline(t) }

func (n netWriter) SetWriteDeadline(t time.Time) error { return n.rw.(deadliner).SetWriteDeadline(t) }

func (n netWriter) EnableFullDuplex() error { return n.rw.(fullDuplexer).EnableFullDuplex() }

func (n netWriter) Unwrap() http.ResponseWriter { return n.rw }

func (n netWriter) CloseNotify() <-chan bool {
	return n.rw.(http.CloseNotifier).CloseNotify() //nolint:staticcheck // the server's writer has it
}

// http1Writer wraps net/http's HTTP/1.x writer.
type http1Writer struct{ netWriter }

// Hijack takes the connection over (an upgrade: a WebSocket, a tunnel
// a reverse proxy opens to the upstream). From then on the handler only
// carries bytes between its two ends, so it waits on its client until it
// returns: after the target delay it holds no execution slot, as a
// stalled request (intake.Handle.ClientWait), within the same bounds.
func (n http1Writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := n.rw.(http.Hijacker).Hijack()
	if err == nil {
		n.h.ClientWait(intake.Own) // ended by Finish
	}
	return c, brw, err
}

func (n http1Writer) ReadFrom(src io.Reader) (int64, error) { return n.readFrom(src) }

// http2Writer wraps net/http's HTTP/2 writer.
type http2Writer struct{ netWriter }

func (n http2Writer) Push(target string, opts *http.PushOptions) error {
	return n.rw.(http.Pusher).Push(target, opts)
}

// clientBody is the handler's request body, when the middleware did not
// read all of it ahead.
type clientBody struct {
	io.ReadCloser
	h     *intake.Handle
	owner int64 // the handler's goroutine
}

func (b *clientBody) Read(p []byte) (int, error) {
	g := waiter(b.owner)
	b.h.ClientWait(g)
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.h.ClientDone(g) // the body is over: this goroutine waits on the client no more
	} else {
		b.h.ClientResume(g)
	}
	return n, err
}

// waiter names the calling goroutine for intake.Handle.ClientWait:
// intake.Own on the handler's own goroutine (owner), else its id, so that
// a full-duplex handler reading its body on another goroutine while its
// own computes does not free its slot.
func waiter(owner int64) uint64 {
	if g := goid.Get(); g != owner {
		return uint64(g)
	}
	return intake.Own
}
