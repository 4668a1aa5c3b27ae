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
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/intake"
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
	return context.WithValue(ctx, connKey{}, new(intake.Conn))
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
	// The four values share one array: one allocation, not four.
	v := []string{oe.Kind.Token(), outcome.FormatRetryAfterSeconds(oe.RetryAfter), "text/plain; charset=utf-8", "nosniff"}
	h := w.Header()
	h[outcomeHeader] = v[0:1:1]
	h[retryAfterHeader] = v[1:2:2]
	h["Content-Type"] = v[2:3:3]
	h["X-Content-Type-Options"] = v[3:4:4]
	w.WriteHeader(StatusCode(oe.Kind))
	io.WriteString(w, oe.Error())
	io.WriteString(w, "\n")
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
