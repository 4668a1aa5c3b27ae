// Package triagesidecar puts triage in front of a service written in any
// language, and behind its outgoing calls, over HTTP.
//
// Ingress is a reverse proxy to one local upstream: every request runs
// through triagehttp's middleware (trust, edge rules, criticality, decay,
// customer, client type, quota, admission) and is forwarded with the
// criticality, attempt counter and deadline it was given. Egress is a
// reverse proxy from the service to one service it calls, with the client
// side of the book: adaptive throttling, the retry budget and the attempt
// counter (an egress.Caller and triagehttp.Transport).
//
// Both speak HTTP/1.1, HTTP/2 over TLS and cleartext HTTP/2 (h2c) as the
// server they are given allows, and so gRPC: a request whose Content-Type
// is application/grpc gets a refusal as the gRPC status triagegrpc gives
// it (in the compact form, without details, that triagegrpc reads), its
// grpc-timeout becomes its deadline, and what is left of that deadline is
// forwarded. An HTTP request's deadline is its context's (WithTimeout).
//
// The upstream's CPU is another process's: give Ingress's middleware an
// admission.Controller in its latency mode (admission.WithTolerance, as
// the batch proxy does), so that the sidecar forwards as many requests at
// once as keep the upstream's latency near its best.
//
// An Ingress or Egress handler is safe for concurrent use. It holds no
// state of its own beyond its options'; what bounds it is its
// admission.Controller's queue and the server's limits.
package triagesidecar

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/internal/grpcwire"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/signals"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagehttp"
)

// DefaultEgressBody is how much of a request body Egress keeps so that a
// retry can send it again: 64 KiB. A longer body is sent once.
const DefaultEgressBody = 64 << 10

// Option configures Ingress or Egress.
type Option interface{ apply(*config) }

type config struct {
	transport  http.RoundTripper
	middleware []triagehttp.Option
	timeout    time.Duration
	grace      time.Duration
	egressBody int
	clock      clock.Clock
	load       *signals.Reported // WithUpstreamLoad
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithTransport sets the round tripper that reaches the upstream.
// Default: Transport(upstream, nil).
func WithTransport(rt http.RoundTripper) Option {
	return optionFunc(func(c *config) { c.transport = rt })
}

// WithMiddleware adds options for the triagehttp middleware in front of
// the proxy (trust, classifier, admission, lifecycle, quota, shadow,
// health-check paths). Ingress's default is triagehttp's: nobody trusted,
// no admission. Egress's middleware trusts loopback, where the service
// that calls through it runs, and has no admission.
func WithMiddleware(opts ...triagehttp.Option) Option {
	return optionFunc(func(c *config) { c.middleware = append(c.middleware, opts...) })
}

// WithTimeout sets the deadline of a request that comes without one
// (an HTTP request, or a gRPC call without grpc-timeout). Default 0:
// none, beyond the caller's going away.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.timeout = d })
}

// WithAbandonGrace sets how long Ingress keeps waiting for the upstream
// after a caller went away before it cancels the upstream's request.
// An upstream in most languages does not notice that a connection
// closed and finishes the request anyway: until it does, the request
// keeps its execution slot, so that admission counts what the upstream
// is really doing. A request whose deadline passed is cancelled at once
// (its deadline was forwarded). Default DefaultAbandonGrace.
func WithAbandonGrace(d time.Duration) Option {
	return optionFunc(func(c *config) { c.grace = d })
}

// WithClock sets the clock of the abandon grace (WithAbandonGrace).
// Default: the real clock.
func WithClock(c clock.Clock) Option { return optionFunc(func(cfg *config) { cfg.clock = c }) }

// DefaultAbandonGrace is how long Ingress waits for the upstream after
// the caller went away: 10 s.
const DefaultAbandonGrace = 10 * time.Second

// WithEgressBody sets how much of a request's body Egress keeps for
// retries (0 to 16 MiB). Default DefaultEgressBody.
func WithEgressBody(n int) Option {
	return optionFunc(func(c *config) { c.egressBody = n })
}

func newConfig(upstream *url.URL, opts []Option) (config, error) {
	c := config{egressBody: DefaultEgressBody, grace: DefaultAbandonGrace}
	for _, o := range opts {
		o.apply(&c)
	}
	c.clock = clock.OrReal(c.clock)
	switch {
	case upstream == nil || upstream.Host == "":
		return c, errors.New("triagesidecar: the upstream needs a host")
	case upstream.Scheme != "http" && upstream.Scheme != "https" && upstream.Scheme != "h2c":
		return c, fmt.Errorf("triagesidecar: upstream scheme %q: want http, https or h2c", upstream.Scheme)
	case c.timeout < 0 || c.grace < 0:
		return c, fmt.Errorf("triagesidecar: negative timeout %v or abandon grace %v", c.timeout, c.grace)
	case c.egressBody < 0 || c.egressBody > 16<<20:
		return c, fmt.Errorf("triagesidecar: egress body buffer %d: want 0 to 16 MiB", c.egressBody)
	}
	if c.transport == nil {
		rt, err := Transport(upstream, nil)
		if err != nil {
			return c, err
		}
		c.transport = rt
	}
	return c, nil
}

// Transport returns an http.Transport for upstream's scheme: http speaks
// HTTP/1.1, h2c cleartext HTTP/2 (with prior knowledge, as gRPC
// upstreams need), https HTTP/2 or HTTP/1.1 over TLS with tlsConfig (nil:
// the system roots).
func Transport(upstream *url.URL, tlsConfig *tls.Config) (*http.Transport, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.TLSClientConfig = tlsConfig
	t.MaxIdleConnsPerHost = 256
	var p http.Protocols
	switch upstream.Scheme {
	case "http":
		p.SetHTTP1(true)
	case "h2c":
		p.SetUnencryptedHTTP2(true)
	case "https":
		p.SetHTTP1(true)
		p.SetHTTP2(true)
	default:
		return nil, fmt.Errorf("triagesidecar: upstream scheme %q: want http, https or h2c", upstream.Scheme)
	}
	t.Protocols = &p
	return t, nil
}

// target is upstream as net/http dials it: h2c is http on the wire.
func target(upstream *url.URL) *url.URL {
	u := *upstream
	if u.Scheme == "h2c" {
		u.Scheme = "http"
	}
	return &u
}

// Ingress returns a reverse proxy to upstream (http://, https:// or
// h2c:// for cleartext HTTP/2) behind triagehttp's middleware. A request
// the middleware admits is forwarded with the Host and path it came with
// (joined to upstream's path), the X-Forwarded headers, its criticality,
// decay, customer and the attempt counter it came with, and for gRPC the
// time left before its deadline. An upstream that cannot be reached is
// answered 502 (gRPC: UNAVAILABLE), a deadline that passed 504 (gRPC:
// DEADLINE_EXCEEDED); the upstream's own answers, refusals included,
// pass through unchanged.
func Ingress(upstream *url.URL, opts ...Option) (http.Handler, error) {
	c, err := newConfig(upstream, opts)
	if err != nil {
		return nil, err
	}
	mw, err := triagehttp.Middleware(append(c.middleware, triagehttp.WithErrorWriter(WriteError))...)
	if err != nil {
		return nil, fmt.Errorf("triagesidecar: %w", err)
	}
	// Every request the sidecar forwards goes to its own service: the
	// upstream is internal, and its attempt is the caller's.
	keys, err := egress.New(egress.WithoutPolicy(), egress.WithInternal("*"))
	if err != nil {
		return nil, err
	}
	to := target(upstream)
	rp := &httputil.ReverseProxy{
		Transport:  upstreamWaits{c.transport},
		BufferPool: new(copyBuffers),
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(to)
			pr.Out.Host = pr.In.Host
			openUntilRead(pr.Out)
			pr.SetXForwarded()
			ctx := pr.In.Context()
			call := keys.Begin(ctx, to.Host)
			k, _ := call.Keys(ctx)
			call.End()
			k.Attempt = attempt.Incoming(ctx)
			triagehttp.SetKeys(pr.Out.Header, k)
			setTimeout(pr.Out, ctx)
			closeAfterIgnoredBody(pr)
		},
		ErrorHandler: upstreamError,
	}
	return withDeadline(mw(finishing(reportsLoad(noH2CUpgrade(rp), c.load), c.clock, c.grace)), c.timeout), nil
}

// copyBufferSize is the size of the buffers a proxy copies answers
// through, httputil.ReverseProxy's own.
const copyBufferSize = 32 << 10

// copyBuffers are the buffers a reverse proxy copies answers through
// (httputil.BufferPool; without one it allocates a buffer a request): as
// many as copies run at once, and the collector takes back those a quiet
// period leaves unused (a sync.Pool). Safe for concurrent use.
type copyBuffers struct{ p sync.Pool }

func (b *copyBuffers) Get() []byte {
	if a, ok := b.p.Get().(*[copyBufferSize]byte); ok {
		return a[:]
	}
	return new([copyBufferSize]byte)[:]
}

func (b *copyBuffers) Put(buf []byte) {
	if len(buf) == copyBufferSize {
		b.p.Put((*[copyBufferSize]byte)(buf))
	}
}

// noH2CUpgrade drops a request's offer to upgrade to h2c (RFC 7540,
// 3.2): forwarded, it would make the connection to the upstream an
// HTTP/2 tunnel whose requests no admission sees. The request goes on as
// HTTP/1.1, which a server may always answer instead; a client that wants
// HTTP/2 speaks it to the sidecar with prior knowledge.
func noH2CUpgrade(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !httpguts.HeaderValuesContainsToken(r.Header["Upgrade"], "h2c") {
			next.ServeHTTP(w, r)
			return
		}
		r.Header.Del("Upgrade")
		r.Header.Del("Http2-Settings")
		var conn []string
		for _, v := range r.Header["Connection"] {
			for _, tok := range strings.Split(v, ",") {
				if tok = strings.TrimSpace(tok); tok != "" && !strings.EqualFold(tok, "upgrade") && !strings.EqualFold(tok, "http2-settings") {
					conn = append(conn, tok)
				}
			}
		}
		if len(conn) > 0 {
			r.Header["Connection"] = conn
		} else {
			r.Header.Del("Connection")
		}
		next.ServeHTTP(w, r)
	})
}

// closeAfterIgnoredBody closes the upstream connection after a request
// that has a body although its method gives a body no meaning (GET, HEAD,
// OPTIONS, DELETE, TRACE): an HTTP/1.1 upstream that does not read it
// (Python's http.server, for one) would parse it as the next request on
// the connection, one that skipped admission and carried whatever triage
// keys the caller wrote into it.
func closeAfterIgnoredBody(pr *httputil.ProxyRequest) {
	if pr.In.ContentLength == 0 {
		return
	}
	switch pr.In.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodDelete, http.MethodTrace:
		pr.Out.Close = true
	}
}

// finishing runs next with a context the caller's going away does not
// cancel for grace: the upstream's request, and the execution slot, last
// until the upstream answers (see WithAbandonGrace). The context keeps
// the request's values and its deadline.
func finishing(next http.Handler, clk clock.Clock, grace time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		up, cancel := context.WithCancel(context.WithoutCancel(ctx))
		if dl, ok := ctx.Deadline(); ok {
			up, cancel = context.WithDeadline(context.WithoutCancel(ctx), dl)
		}
		var t atomic.Pointer[clock.Timer]
		stop := context.AfterFunc(ctx, func() {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				cancel()
				return
			}
			tm := clock.AfterFunc(clk, grace, cancel)
			t.Store(&tm)
		})
		defer func() {
			stop()
			cancel()
			if tm := t.Load(); tm != nil {
				(*tm).Stop() // a timer stored after this fires cancel again: harmless
			}
		}()
		next.ServeHTTP(w, r.WithContext(up))
	})
}

// withDeadline gives each request the deadline its grpc-timeout names,
// or def when it has none (0: none).
func withDeadline(next http.Handler, def time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, ok := time.Duration(0), false
		if isGRPC(r) {
			d, ok = grpcwire.ParseTimeout(r.Header.Get("Grpc-Timeout"))
		}
		if !ok && def > 0 {
			d, ok = def, true
		}
		if ok {
			ctx, cancel := context.WithTimeout(r.Context(), d)
			defer cancel()
			r = r.WithContext(ctx)
		}
		next.ServeHTTP(w, r)
	})
}

// setTimeout writes what is left of ctx's deadline as out's grpc-timeout,
// for a gRPC request.
func setTimeout(out *http.Request, ctx context.Context) {
	if !isGRPC(out) {
		return
	}
	if dl, ok := ctx.Deadline(); ok {
		out.Header.Set("Grpc-Timeout", grpcwire.FormatTimeout(time.Until(dl)))
	}
}

// upstreamError answers a request the upstream did not: its deadline
// passed (504), its caller went away (nothing to answer), or the upstream
// could not be reached or broke off (502).
func upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if WriteError(w, r, err) {
		return
	}
	switch {
	case errors.Is(r.Context().Err(), context.DeadlineExceeded):
		writeFailure(w, r, http.StatusGatewayTimeout, codeDeadlineExceeded, "triagesidecar: deadline exceeded before the upstream answered")
	case r.Context().Err() != nil:
		// The caller is gone: nobody reads an answer.
	default:
		writeFailure(w, r, http.StatusBadGateway, codeUnavailable, "triagesidecar: upstream: "+err.Error())
	}
}

// WriteError writes err, an overload outcome, for r and reports whether it
// did: for a gRPC request as a gRPC status in a trailers-only response,
// otherwise as triagehttp.WriteError does. It is the sidecar's
// triagehttp.WithErrorWriter.
func WriteError(w http.ResponseWriter, r *http.Request, err error) bool {
	if !isGRPC(r) {
		return triagehttp.WriteError(w, err)
	}
	oe, ok := outcome.As(outcome.Upward(err))
	if !ok || !oe.Kind.Overload() {
		return false
	}
	writeStatus(w, int(triagegrpc.Code(oe.Kind)), oe.Error())
	return true
}

// writeFailure answers r with an HTTP status, or for gRPC with a gRPC
// code.
func writeFailure(w http.ResponseWriter, r *http.Request, httpStatus, grpcCode int, msg string) {
	if isGRPC(r) {
		writeStatus(w, grpcCode, msg)
		return
	}
	http.Error(w, msg, httpStatus)
}

// openBody is a forwarded request's body while the caller may still be
// sending it: until it ends, the handler's waits on the upstream (for the
// response's headers, for each read of its body; upstreamWaits) are waits
// on the caller (intake.Handle.ClientWait) once the body's reads have
// begun, since an upstream whose request is not over (a stream, a call
// whose message has not come) may be waiting for the rest of it. The
// request then stalls, giving its execution slot back, when the caller
// sends nothing for the target delay, as it does waiting on its caller
// directly. Once the body has ended, a wait on the upstream is the
// upstream's work and keeps the slot; before its reads begin (the
// transport dialing, or waiting for 100 Continue), so is it.
type openBody struct {
	io.ReadCloser
	h       *intake.Handle
	mu      sync.Mutex
	reading bool // a read has begun
	ended   bool
	inWait  bool // the handler waits on the upstream
	waiting bool // the handler's wait is told to h as a wait on the caller
}

// openUntilRead wraps out's body in an openBody, under admission control.
func openUntilRead(out *http.Request) {
	h := intake.HandleOf(out.Context())
	if out.Body == nil || out.Body == http.NoBody || h == nil || !h.UnderAdmission() {
		return
	}
	out.Body = &openBody{ReadCloser: out.Body, h: h}
}

func (b *openBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	b.reading = true
	b.tell()
	b.mu.Unlock()
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.mu.Lock()
		b.ended = true
		b.tell()
		b.mu.Unlock()
	}
	return n, err
}

// await runs f, a wait of the handler's on the upstream.
func (b *openBody) await(f func()) {
	b.mu.Lock()
	b.inWait = true
	b.tell()
	b.mu.Unlock()
	f()
	b.mu.Lock()
	b.inWait = false
	b.tell()
	b.mu.Unlock()
}

// tell brings the Handle in line with the state: the handler waits on the
// caller while it waits on the upstream, the body's reads have begun and
// it has not ended. Under b.mu, so that two goroutines' changes reach the
// Handle in order; a ClientResume of a stalled request waits there for
// its slot (intake.Handle.ClientResume), holding up only this request's
// other goroutine.
func (b *openBody) tell() {
	want := b.inWait && b.reading && !b.ended
	switch {
	case want && !b.waiting:
		b.h.ClientWait(intake.Own)
	case !want && b.waiting:
		b.h.ClientResume(intake.Own)
	}
	b.waiting = want
}

// upstreamWaits is the ingress's transport: the waits on the upstream of
// a request whose body is an openBody go through it.
type upstreamWaits struct{ http.RoundTripper }

func (t upstreamWaits) RoundTrip(req *http.Request) (resp *http.Response, err error) {
	b, ok := req.Body.(*openBody)
	if !ok {
		return t.RoundTripper.RoundTrip(req)
	}
	b.await(func() { resp, err = t.RoundTripper.RoundTrip(req) })
	if resp != nil {
		resp.Body = &upstreamBody{ReadCloser: resp.Body, open: b}
	}
	return resp, err
}

// upstreamBody is a response's body whose reads are waits on the
// upstream (openBody.await).
type upstreamBody struct {
	io.ReadCloser
	open *openBody
}

func (u *upstreamBody) Read(p []byte) (n int, err error) {
	u.open.await(func() { n, err = u.ReadCloser.Read(p) })
	return n, err
}
