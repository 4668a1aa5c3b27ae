// Package triagehttp adapts triage to net/http: a middleware that sets a
// request's criticality at the edge (or propagates it on an internal hop), an
// http.RoundTripper that carries criticality and the attempt counter on
// outgoing requests, and the mapping between overload outcomes and HTTP
// responses.
//
// SRE book ch. 21, "Criticality": criticality is set "as close as possible to
// the browsers or mobile clients—typically in the HTTP frontends" and
// propagated from there. The middleware assigns it with the ordered rules of
// package edge; headers sent by peers the operator does not trust (package
// trust) are stripped before any handler sees them: every header that starts
// with the triage- prefix, registered in package wire or not.
//
// Overload outcomes are written as:
//
//	task overloaded          503 Service Unavailable, Triage-Outcome: task-overloaded
//	overloaded; don't retry  503 Service Unavailable, Triage-Outcome: overloaded-dont-retry
//	customer out of quota    429 Too Many Requests,   Triage-Outcome: out-of-quota
//
// each with Retry-After in whole seconds (0 when the server has no opinion).
//
// # What it changes on your server and clients
//
// What a user would not guess from the names:
//
//   - The middleware reads each request's body ahead, up to 64 KiB
//     (WithBodyBuffer), before the request takes an execution slot, so
//     that a slow sender holds none; a body on a slow link is read as
//     long as it keeps coming, one that stops is answered 408 after
//     20 s and a second for every 500 bytes that came (WithBodyTimeout).
//     Of a gRPC request (Content-Type application/grpc) it reads the
//     first message only, waiting half the message timeout
//     (admission.WithMessageTimeout) for it: a stream's later messages
//     may wait on the answers.
//   - Triage-* headers from a peer that is not trusted are removed; the
//     request's criticality is then the rules' or the default, CRITICAL.
//   - Requests wait in Go's run queue before the middleware sees them, so
//     while that queue's delay is over its target, admission sheds them
//     by criticality (admission.RunQueued, reason "queue").
//   - With ConnContext, HTTP/2 connections get gRPC's per-connection
//     protection (a share of the waiting requests, slow-sender
//     penalties); without it, only requests are protected.
//   - Probes: HealthHandler answers 503 in warm-up and lame duck, the
//     right answer for readiness; liveness is LivenessHandler. Give both
//     paths to WithHealthCheck so that admission never refuses them.
//   - Transport sends triage's headers only to the hosts its Caller names
//     internal, and without a Policy returns a task-overloaded answer as
//     an *outcome.Error with no response.
//   - The zero criticality.Level is SHEDDABLE, the lowest.
package triagehttp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/felixge/httpsnoop"
	"github.com/petermattis/goid"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/grpcwire"
	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/trust"
	"github.com/triagehq/triage/wire"
)

// Header names in net/http's canonical spelling: the wire keys' (package
// wire spells them), and Retry-After.
const (
	criticalityHeader = wire.CriticalityHeader
	decayHeader       = wire.DecayHeader
	attemptHeader     = wire.AttemptHeader
	customerHeader    = wire.CustomerHeader
	outcomeHeader     = wire.OutcomeHeader
	lameDuckHeader    = wire.LameDuckHeader
	retryAfterHeader  = "Retry-After"
)

// Option configures the middleware.
type Option interface{ apply(*config) }

type config struct {
	intake     []intake.Option
	group      func(*http.Request) string
	health     []string
	lifecycle  *lifecycle.Lifecycle
	admission  *admission.Controller
	bodyBuffer int
	bodyTime   time.Duration // WithBodyTimeout
	bodyRate   int
	writeError func(http.ResponseWriter, *http.Request, error) bool
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithGroup supplies the user-group function for group rules, e.g. one that
// reads the authenticated user's plan. It is called only when the
// classifier has a group rule. Default: no group.
func WithGroup(f func(*http.Request) string) Option {
	return optionFunc(func(c *config) { c.group = f })
}

// WithAdmission installs admission control (intake.WithAdmission): before
// the handler runs, the request must be admitted and get an execution
// slot; a rejected request is answered 503 with Triage-Outcome and never
// reaches the handler. An admitted request's body is read first, up to
// the body buffer (WithBodyBuffer), while it holds no room in the task
// (admission.Controller.Scheduled), within the body timeout
// (WithBodyTimeout): a client slow to send its body waits on itself, and
// one whose body stops coming is answered 408 Request Timeout without its
// handler running. Default: none.
func WithAdmission(ctl *admission.Controller) Option {
	return optionFunc(func(c *config) {
		c.intake = append(c.intake, intake.WithAdmission(ctl))
		c.admission = ctl
	})
}

// DefaultBodyBuffer is how much of an admitted request's body the
// middleware reads before the request takes an execution slot
// (WithAdmission); the rest, if any, the handler reads as it streams in.
const DefaultBodyBuffer = 64 << 10

// WithBodyBuffer sets how much of an admitted request's body is read before
// it takes an execution slot (DefaultBodyBuffer; 0: none, the handler reads
// it all while holding its slot). Each request being read holds at most
// this much memory.
func WithBodyBuffer(n int) Option { return optionFunc(func(c *config) { c.bodyBuffer = n }) }

// Defaults of WithBodyTimeout: Apache's mod_reqtimeout (body=20,MinRate=500).
const (
	DefaultBodyTimeout = 20 * time.Second
	DefaultBodyMinRate = 500 // bytes a second
)

// WithBodyTimeout bounds the read-ahead of a body (WithBodyBuffer): it
// may take d, and one second more for every minRate bytes that came, so
// that a body on a slow link is read, however long, while it keeps
// coming, and one that stops is answered 408 Request Timeout without its
// handler running (minRate 0: d in all). The request holds no execution
// slot meanwhile. Default DefaultBodyTimeout and DefaultBodyMinRate.
func WithBodyTimeout(d time.Duration, minRate int) Option {
	return optionFunc(func(c *config) { c.bodyTime, c.bodyRate = d, minRate })
}

// WithErrorWriter sets how the middleware answers a refusal: f writes err
// (an overload outcome) for r and reports whether it did; a false return
// is answered 503. A reverse proxy uses it to answer gRPC callers with a
// gRPC status. Default: WriteError.
func WithErrorWriter(f func(w http.ResponseWriter, r *http.Request, err error) bool) Option {
	return optionFunc(func(c *config) { c.writeError = f })
}

// WithHealthCheck names the paths of the server's probe endpoints
// (HealthHandler for readiness, LivenessHandler for liveness): requests
// to exactly one of them are classified but answered whatever the load,
// outside isolation, quotas and admission (intake.Request.HealthCheck).
// Each call replaces the paths of the last. Default: none.
func WithHealthCheck(paths ...string) Option {
	paths = slices.Clone(paths)
	return optionFunc(func(c *config) { c.health = paths })
}

// WithIntake passes options to the middleware's intake (intake.New): any
// of the intake's own, such as intake.WithPeerShare.
func WithIntake(opts ...intake.Option) Option {
	return optionFunc(func(c *config) { c.intake = append(c.intake, opts...) })
}

// ConnContext is the http.Server's ConnContext that gives each connection
// the state of triage's connection policy under admission control
// (intake.Conn): its share of the requests not yet started, a bound on its
// stalled requests, and its slow-sender penalty. A request whose body did
// not come within the message timeout is answered 408 and penalises its
// connection: its next requests, health checks aside, are answered 503
// (Triage-Outcome: task-overloaded; late) at arrival for the penalty,
// paced, then it is on probation. The penalty matters over HTTP/2, where
// one connection carries many requests; over HTTP/1.1 the connection is
// closed after its 408. A server with a ConnContext of its own calls this
// one from it:
//
//	srv := &http.Server{Handler: mw(h), ConnContext: triagehttp.ConnContext}
func ConnContext(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, intake.NewConn())
}

type connKey struct{}

// connOf returns the connection's state ConnContext put in ctx, or nil.
func connOf(ctx context.Context) *intake.Conn {
	c, _ := ctx.Value(connKey{}).(*intake.Conn)
	return c
}

// WithLifecycle makes every response carry Triage-Lame-Duck: 1 while l is
// in lame duck. Default: none.
func WithLifecycle(l *lifecycle.Lifecycle) Option {
	return optionFunc(func(c *config) { c.lifecycle = l })
}

// Middleware returns the edge middleware: for every request it builds an
// intake.Request (peer, Host, path, header), runs it through the intake
// (trust, stripping, classification, decay, customer, client type, quota,
// admission), answers a refusal with its overload outcome, and otherwise
// runs the handler with the request's context (criticality.Of,
// attempt.Incoming, quota.CustomerOf). Under admission control the
// handler's body reads past what the middleware read ahead, its flushes,
// and its writes past the first 2 KiB of the response (what net/http
// buffers whatever the client does) wait on the client
// (intake.Handle.ClientWait): a handler blocked for the target delay on a
// client that does not read its response, opens no HTTP/2 flow-control
// window, or does not send its body gives its execution slot and room
// back until the wait ends; its ResponseWriter is then a wrapper with
// exactly the optional interfaces of the server's (http.Flusher and
// FlushError, http.Hijacker, io.ReaderFrom, http.Pusher, io.StringWriter)
// that unwraps (http.ResponseController) to it. The returned func is safe
// for concurrent use.
func Middleware(opts ...Option) (func(http.Handler) http.Handler, error) {
	c := config{bodyBuffer: DefaultBodyBuffer, bodyTime: DefaultBodyTimeout, bodyRate: DefaultBodyMinRate, writeError: writeError}
	for _, o := range opts {
		o.apply(&c)
	}
	if c.bodyBuffer < 0 {
		return nil, fmt.Errorf("triagehttp: body buffer must be at least 0, got %d", c.bodyBuffer)
	}
	if c.bodyTime <= 0 || c.bodyRate < 0 {
		return nil, fmt.Errorf("triagehttp: body timeout must be over 0 and its minimum rate at least 0, got %v and %d", c.bodyTime, c.bodyRate)
	}
	in, err := intake.New(c.intake...)
	if err != nil {
		return nil, fmt.Errorf("triagehttp: %w", err)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if c.lifecycle != nil && c.lifecycle.InLameDuck() {
				w.Header()[lameDuckHeader] = lameDuckValue
			}
			ir := intake.Request{Peer: PeerOf(r), Host: r.Host, Path: r.URL.Path, Conn: connOf(r.Context()),
				Header: r.Header, Case: intake.Canonical, HealthCheck: slices.Contains(c.health, r.URL.Path), RunQueued: true}
			if c.group != nil && in.NeedsGroup() {
				ir.Group = c.group(r)
			}
			h, err := in.Accept(r.Context(), &ir)
			guardTrailers(r)
			whole := false // the whole body read ahead
			if err == nil && c.admission != nil && c.bodyBuffer > 0 && !ir.HealthCheck && hasBody(r) {
				h.Scheduled()
				ra := readAhead{limit: c.bodyBuffer, firstMessage: c.admission.MessageTimeout() / 2, body: c.bodyTime, minRate: c.bodyRate}
				if h.InShadow() {
					ra = readAhead{limit: c.bodyBuffer} // no deadline, as without triage
				}
				var err error
				var arrived bool
				if whole, arrived, err = ra.read(w, r); err != nil {
					h.MessageTimedOut()
					slowBody(w, r)
					return
				}
				switch {
				case h.InShadow():
					h.MessageArrived() // a late one is counted at Start
				case arrived:
					h.Received() // however slow the link: the client's time
				}
			}
			if err == nil {
				err = h.Start()
			}
			if err != nil {
				if !c.writeError(w, r, err) {
					w.WriteHeader(http.StatusServiceUnavailable) // the caller went away while waiting
				}
				return
			}
			defer h.Finish()
			if h.UnderAdmission() {
				w, r = onClient(w, r, h, whole)
			}
			next.ServeHTTP(w, r.WithContext(h))
		})
	}, nil
}

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

func (n netWriter) Header() http.Header                { return n.rw.Header() }
func (n netWriter) Write(p []byte) (int, error)        { return n.write(p) }
func (n netWriter) WriteString(s string) (int, error)  { return n.writeString(s) }
func (n netWriter) WriteHeader(code int)               { n.rw.WriteHeader(code) }
func (n netWriter) Flush()                             { n.flushError() }
func (n netWriter) FlushError() error                  { return n.flushError() }
func (n netWriter) SetReadDeadline(t time.Time) error  { return n.rw.(deadliner).SetReadDeadline(t) }
func (n netWriter) SetWriteDeadline(t time.Time) error { return n.rw.(deadliner).SetWriteDeadline(t) }
func (n netWriter) EnableFullDuplex() error            { return n.rw.(fullDuplexer).EnableFullDuplex() }
func (n netWriter) Unwrap() http.ResponseWriter        { return n.rw }
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

// guardTrailers has r's body remove the triage keys from r's trailers
// when it ends, before the handler or a proxy behind it can read them:
// triage's keys travel in headers only, whoever sends them. Only a body
// that can end in trailers is wrapped (HTTP/1.1 chunked, HTTP/2).
func guardTrailers(r *http.Request) {
	if hasBody(r) && (r.ProtoMajor >= 2 || len(r.TransferEncoding) > 0) {
		r.Body = &trailerGuard{ReadCloser: r.Body, r: r}
	}
}

// trailerGuard is a request body that removes the triage keys from its
// request's trailers at its end (guardTrailers).
type trailerGuard struct {
	io.ReadCloser
	r *http.Request
}

func (b *trailerGuard) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		for k := range b.r.Trailer {
			if wire.IsTriage(k) {
				delete(b.r.Trailer, k)
			}
		}
	}
	return n, err
}

// hasBody says whether r has a body to read.
func hasBody(r *http.Request) bool {
	return r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0
}

// readAhead is a body's read-ahead (WithBodyBuffer, WithBodyTimeout):
// the zero durations wait as long as the body takes.
type readAhead struct {
	limit        int
	firstMessage time.Duration // a gRPC request's wait for its first message
	body         time.Duration // WithBodyTimeout
	minRate      int
}

// read reads up to ra.limit of r's body ahead and puts it back in front
// of the rest; whole says it read the body to its end, arrived that what
// it waited for came (false for a gRPC request that goes on without its
// first message). A gRPC request's first message is waited for at most
// ra.firstMessage (readFirstMessage).
// Any other body may take ra.body, and a second more for every
// ra.minRate bytes that came (pacedBody): past that, the error is
// os.ErrDeadlineExceeded, answered 408 by the caller. Any other read
// error is left for the handler, as without triage. The read deadline is
// the connection's (http.ResponseController); afterwards the server's
// ReadTimeout, if it has one, holds again from when the request came in.
func (ra readAhead) read(w http.ResponseWriter, r *http.Request) (whole, arrived bool, err error) {
	grpc := grpcwire.IsGRPC(r.Header.Get("Content-Type"))
	if grpc && ra.firstMessage > 0 {
		whole, arrived = readFirstMessage(r, ra.limit, ra.firstMessage)
		return whole, arrived, nil
	}
	start := time.Now()
	rc := http.NewResponseController(w)
	var body io.Reader = r.Body
	deadlines := ra.body > 0 && rc.SetReadDeadline(start.Add(ra.body)) == nil
	if deadlines && ra.minRate > 0 {
		body = &pacedBody{Reader: r.Body, rc: rc, by: start.Add(ra.body), minRate: ra.minRate}
	}
	head, whole, err := readHead(body, grpc, ra.limit)
	if deadlines {
		var restore time.Time
		if srv, _ := r.Context().Value(http.ServerContextKey).(*http.Server); srv != nil && srv.ReadTimeout > 0 {
			restore = start.Add(srv.ReadTimeout)
		}
		rc.SetReadDeadline(restore)
	}
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return false, false, err
	case err != nil:
		// Any other error (a body over http.MaxBytesReader's limit, a
		// malformed chunk, a client gone) is the handler's to answer, as
		// without triage: its body reads what came, then the error.
		r.Body = &prefixedBody{Reader: io.MultiReader(bytes.NewReader(head), errReader{err}), body: r.Body}
		return true, true, nil
	case whole:
		r.Body = &prefixedBody{Reader: bytes.NewReader(head), body: r.Body}
		return true, true, nil
	}
	r.Body = &prefixedBody{Reader: io.MultiReader(bytes.NewReader(head), r.Body), body: r.Body}
	return false, true, nil
}

// pacedBody moves a body's read deadline on by a second for every
// minRate bytes that come (Apache's mod_reqtimeout MinRate): a body that
// keeps coming at that rate is never cut off, one that stops is.
type pacedBody struct {
	io.Reader
	rc      *http.ResponseController
	by      time.Time // the deadline before any byte came
	minRate int
	n       int64
}

func (p *pacedBody) Read(b []byte) (int, error) {
	n, err := p.Reader.Read(b)
	if n > 0 {
		p.n += int64(n)
		p.rc.SetReadDeadline(p.by.Add(time.Duration(p.n) * time.Second / time.Duration(p.minRate)))
	}
	return n, err
}

// readFirstMessage waits up to wait for a gRPC request's first message
// (readHead), and puts what it read back in front of the rest of the
// body; whole says the body ended with it. A stream whose server speaks
// first sends nothing until it has heard from the server, so past wait
// the request goes on without its message: its body's reads then wait
// for the one under way, as waits on the client (onClient), and arrived
// is false. Half the message timeout, so that Start does not refuse the
// request as late.
func readFirstMessage(r *http.Request, limit int, wait time.Duration) (whole, arrived bool) {
	body := r.Body
	done := make(chan headRead, 1)
	go func() {
		var h headRead
		h.head, h.whole, h.err = readHead(body, true, limit)
		done <- h
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case h := <-done:
		r.Body = h.body(body)
		return h.whole || h.err != nil, true
	case <-t.C:
		r.Body = &pendingBody{done: done, body: body}
		return false, false
	}
}

// headRead is what readHead returned.
type headRead struct {
	head  []byte
	whole bool
	err   error
}

// body is the request's body with h put back in front of rest.
func (h headRead) body(rest io.ReadCloser) io.ReadCloser {
	switch {
	case h.err != nil:
		return &prefixedBody{Reader: io.MultiReader(bytes.NewReader(h.head), errReader{h.err}), body: rest}
	case h.whole:
		return &prefixedBody{Reader: bytes.NewReader(h.head), body: rest}
	}
	return &prefixedBody{Reader: io.MultiReader(bytes.NewReader(h.head), rest), body: rest}
}

// pendingBody is a body whose first message is still being read
// (readFirstMessage): its first Read waits for it. Close closes the body,
// which ends that read.
type pendingBody struct {
	done <-chan headRead
	body io.ReadCloser
	r    io.Reader // once the first message is in
}

func (b *pendingBody) Read(p []byte) (int, error) {
	if b.r == nil {
		b.r = (<-b.done).body(b.body)
	}
	return b.r.Read(p)
}

func (b *pendingBody) Close() error { return b.body.Close() }

// readHead reads the start of body: up to limit bytes, or for a gRPC
// request its first length-prefixed message if it fits, since a stream's
// later messages may wait for the server's answers. whole says the body
// ended.
func readHead(body io.Reader, grpc bool, limit int) (head []byte, whole bool, err error) {
	if !grpc || limit < 5 {
		head, err = io.ReadAll(io.LimitReader(body, int64(limit)))
		return head, err == nil && len(head) < limit, err
	}
	var prefix [5]byte
	n, err := io.ReadFull(body, prefix[:])
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return prefix[:n], true, nil // the handler sees the short body as it is
	}
	if err != nil {
		return prefix[:n], false, err
	}
	size := binary.BigEndian.Uint32(prefix[1:])
	if uint64(size) > uint64(limit-5) {
		return prefix[:], false, nil // the rest streams in under the handler
	}
	head = make([]byte, 5+int(size))
	copy(head, prefix[:])
	n, err = io.ReadFull(body, head[5:])
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return head[:5+n], true, nil
	}
	return head[:5+n], false, err
}

// slowBody answers a request whose body did not come within the message
// timeout: 408. Over HTTP/1.1 the connection closes, since the rest of
// the body would be read as the next request; over HTTP/2 only the
// stream ends, since net/http would close a connection other callers
// share (GOAWAY) for a Connection: close.
func slowBody(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor < 2 {
		w.Header().Set("Connection", "close")
	}
	w.WriteHeader(http.StatusRequestTimeout)
}

// errReader returns its error.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// prefixedBody is a body whose first bytes were read ahead.
type prefixedBody struct {
	io.Reader
	body io.ReadCloser
}

func (b *prefixedBody) Close() error { return b.body.Close() }

// PeerOf returns what the server knows about the caller: the IP address of
// r.RemoteAddr and, when the TLS client certificate was verified, its URI
// and DNS SANs.
//
// It trusts r.RemoteAddr. Behind a proxy or load balancer that terminates
// connections, that is the proxy's address, so a network trusted for the
// proxy is trusted for everyone the proxy forwards; and middleware that
// rewrites RemoteAddr from X-Forwarded-For (or PROXY protocol that nobody
// checks) lets callers choose the address trust decides on. Trust such
// proxies by identity (mTLS) or only if they strip triage's headers
// themselves, and never rewrite RemoteAddr from a header before this
// middleware.
func PeerOf(r *http.Request) trust.Peer {
	var p trust.Peer
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		p.Addr = ap.Addr().Unmap()
	}
	p.Identities = trust.Identities(r.TLS)
	return p
}

var lameDuckValue = []string{"1"}

// Transport is the net/http binding of an egress.Caller: an
// http.RoundTripper that writes each attempt's triage headers
// (egress.Call.Keys), replacing any already there, into requests to the
// hosts the Caller names internal (the request URL's host), and sends
// requests to every other host without triage headers at all; with a
// policy, it runs each request under it: adaptive throttling, up to three
// attempts of a request the backend answered "task overloaded" (503 with
// Triage-Outcome), the per-client retry budget and backoff, and the
// client type's route (egress.WithIsolation). What a request carries, to
// which hosts, and under which policy is the Caller's, the same for every
// transport. It is safe for concurrent use.
//
// With a policy, RoundTrip returns:
//   - the response, when the policy did not have to give up (a success, any
//     other status, and "overloaded; don't retry" or "out of quota"
//     answered by the backend: read those with FromResponse);
//   - an error wrapping an *outcome.Error of kind DontRetry, with no
//     response, when it gave up (throttled locally, attempts or budget
//     used up, no time left before the deadline). http.Client returns it
//     inside a *url.Error; errors.Is(err, outcome.ErrDontRetry) holds.
//     A reverse proxy can answer it with WriteError in its ErrorHandler.
//
// A request whose body cannot be replayed (Body set, GetBody nil) is sent
// once. Each attempt is a new round trip on Base, so it is load balanced
// like a new request. Use one Transport (one Caller) per backend service.
type Transport struct {
	// Base makes the request; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Caller is the client side of the backend service (package
	// egress). Nil: each request is sent once, without triage headers,
	// as a call of a nil Caller (egress.Caller.Begin).
	Caller *egress.Caller
}

// RoundTrip implements http.RoundTripper. The caller's request is not
// modified: headers are set on a clone.
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	call := t.Caller.Begin(r.Context(), r.URL.Host)
	var resp *http.Response
	first := true
	once := r.Body != nil && r.Body != http.NoBody && r.GetBody == nil
	err := call.Do(once, func(ctx context.Context) error {
		k, internal := call.Keys(ctx)
		out := withHeaders(r, ctx, k, internal)
		if !first && r.GetBody != nil {
			body, err := r.GetBody()
			if err != nil {
				return err
			}
			out.Body = body
		}
		first = false
		res, err := base.RoundTrip(out)
		if err != nil {
			return err
		}
		if oe, ok := FromResponse(res); ok {
			if oe.Kind == outcome.TaskOverloaded {
				// The policy decides: retry or give up. Either way this
				// response is done with.
				io.Copy(io.Discard, io.LimitReader(res.Body, 4<<10))
				res.Body.Close()
				return oe
			}
			resp = res
			return oe
		}
		resp = res
		return nil
	})
	if resp == nil {
		call.End()
		if err == nil {
			err = errors.New("triagehttp: no response") // unreachable: a nil error always comes with a response
		}
		return nil, err
	}
	if call.Context() == r.Context() {
		call.End()
	} else {
		// The response's body is read under the call's context, which a
		// route change cancels: the call ends when the body is closed.
		// An upgraded connection's body (101 Switching Protocols) is
		// also written to.
		if rw, ok := resp.Body.(io.ReadWriteCloser); ok {
			resp.Body = &endingConn{ReadWriteCloser: rw, end: call.End}
		} else {
			resp.Body = &endingBody{ReadCloser: resp.Body, end: call.End}
		}
	}
	return resp, nil
}

// endingBody ends its call when closed.
type endingBody struct {
	io.ReadCloser
	end func()
}

func (b *endingBody) Close() error {
	err := b.ReadCloser.Close()
	b.end()
	return err
}

// endingConn is endingBody for an upgraded connection.
type endingConn struct {
	io.ReadWriteCloser
	end func()
}

func (b *endingConn) Close() error {
	err := b.ReadWriteCloser.Close()
	b.end()
	return err
}

// withHeaders clones r for ctx without any triage header and, for an
// internal host, with the triage headers of k.
func withHeaders(r *http.Request, ctx context.Context, k egress.Keys, internal bool) *http.Request {
	out := r.Clone(ctx)
	for name := range out.Header {
		if wire.IsTriage(name) {
			delete(out.Header, name)
		}
	}
	if internal {
		SetKeys(out.Header, k)
	}
	return out
}

// SetKeys writes the triage headers of k into h (criticality, and the
// attempt counter, decay and customer when k has them), replacing any of
// those already there. Transport calls it for internal hosts; a reverse
// proxy that forwards a request as it came calls it on the outgoing
// request.
func SetKeys(h http.Header, k egress.Keys) {
	h[criticalityHeader] = []string{k.Level.String()}
	delete(h, attemptHeader)
	delete(h, decayHeader)
	delete(h, customerHeader)
	if k.Attempt > 0 {
		h[attemptHeader] = []string{attempt.Format(k.Attempt)}
	}
	if k.Decay != "" {
		h[decayHeader] = []string{k.Decay}
	}
	if k.Customer != "" {
		h[customerHeader] = []string{k.Customer}
	}
}

// StatusCode returns the HTTP status of an overload kind: 503 for
// TaskOverloaded and DontRetry, 429 for OutOfQuota, 0 otherwise.
func StatusCode(k outcome.Kind) int {
	switch k {
	case outcome.TaskOverloaded, outcome.DontRetry:
		return http.StatusServiceUnavailable
	case outcome.OutOfQuota:
		return http.StatusTooManyRequests
	}
	return 0
}

// WriteError writes err as an HTTP response if it is an overload outcome
// and reports whether it did. Outcomes received from downstream calls are
// first passed through outcome.Upward, so the caller of this service does
// not retry what this service already gave up on.
func WriteError(w http.ResponseWriter, err error) bool {
	oe, ok := outcome.As(outcome.Upward(err))
	if !ok || !oe.Kind.Overload() {
		return false
	}
	h := w.Header()
	h.Set(outcomeHeader, oe.Kind.Token())
	h.Set(retryAfterHeader, outcome.FormatRetryAfterSeconds(oe.RetryAfter))
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(StatusCode(oe.Kind))
	fmt.Fprintln(w, oe.Error())
	return true
}

func writeError(w http.ResponseWriter, _ *http.Request, err error) bool { return WriteError(w, err) }

// FromResponse decodes an overload outcome from a response: status 503 or
// 429 with a Triage-Outcome header naming an outcome that fits the status
// (one value, one of the three tokens), and Retry-After in delta-seconds
// (malformed or absent: 0). Anything else returns false. The result has
// Downstream set.
func FromResponse(resp *http.Response) (*outcome.Error, bool) {
	if resp == nil {
		return nil, false
	}
	k, ok := outcome.ParseToken(single(resp.Header, outcomeHeader))
	if !ok || StatusCode(k) != resp.StatusCode {
		return nil, false
	}
	e := &outcome.Error{Kind: k, Downstream: true}
	if d, ok := outcome.ParseRetryAfterSeconds(single(resp.Header, retryAfterHeader)); ok {
		e.RetryAfter = d
	}
	return e, true
}

// single returns the only value of a header, by canonical name; absent or
// repeated gives "".
func single(h http.Header, canonical string) string {
	v := h[canonical]
	if len(v) != 1 {
		return ""
	}
	return v[0]
}
