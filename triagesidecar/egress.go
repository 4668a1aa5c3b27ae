package triagesidecar

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"

	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/triagehttp"
)

// Egress returns a reverse proxy from a local service to upstream, one
// service it calls: the service sends its requests to Egress's listener
// instead, with the triage headers of the request it is serving (the
// criticality, decay and customer Ingress gave it; Egress trusts
// loopback by default). Each request is made through
// triagehttp.Transport with caller's policy (adaptive throttling, up to
// three attempts, the retry budget) and the attempt counter; a request
// the client side gives up on is answered with its outcome, as
// triagehttp.WriteError (gRPC: a status) writes it, so the service passes
// "overloaded; don't retry" up rather than retrying.
func Egress(upstream *url.URL, caller *egress.Caller, opts ...Option) (http.Handler, error) {
	c, err := newConfig(upstream, append([]Option{WithMiddleware(triagehttp.WithIntake(intake.WithTrust(loopbackTrust())))}, opts...))
	if err != nil {
		return nil, err
	}
	if caller == nil {
		return nil, errors.New("triagesidecar: Egress needs an egress.Caller")
	}
	mw, err := triagehttp.Middleware(append(c.middleware, triagehttp.WithErrorWriter(WriteError))...)
	if err != nil {
		return nil, fmt.Errorf("triagesidecar: %w", err)
	}
	to := target(upstream)
	rp := &httputil.ReverseProxy{
		Transport:  &triagehttp.Transport{Base: c.transport, Caller: caller},
		BufferPool: new(copyBuffers),
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(to)
			pr.SetXForwarded()
			setTimeout(pr.Out, pr.In.Context())
			closeAfterIgnoredBody(pr)
		},
		ErrorHandler: upstreamError,
	}
	return withDeadline(mw(replayable(rp, c.egressBody)), c.timeout), nil
}

// replayable keeps up to limit bytes of a request's body as it streams to
// the upstream, so that a retry can send it again (GetBody). Nothing is
// read ahead: a full-duplex call, whose next message waits for the
// upstream's answer, flows as it would without the sidecar. A retry
// resends a body that ended within the limit; one of a declared length
// within it is first read to its end (the attempt before was refused
// before reading it all); any other is not resent, and the call fails
// with the refusal's attempt.
func replayable(next http.Handler, limit int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || limit == 0 || r.ContentLength > int64(limit) {
			next.ServeHTTP(w, r)
			return
		}
		kb := &keptBody{ReadCloser: r.Body, limit: limit, known: r.ContentLength >= 0}
		r.Body, r.GetBody = kb, kb.replay
		next.ServeHTTP(w, r)
	})
}

// errNotKept says a retry cannot resend a body: it went past the limit,
// or had not ended when the retry came.
var errNotKept = errors.New("triagesidecar: the request body cannot be sent again (not kept for retries: longer than the limit, or still streaming)")

// keptBody is a request body that keeps what passes through it, up to
// limit bytes (then nothing). It is read by one attempt at a time.
type keptBody struct {
	io.ReadCloser
	limit int
	known bool // a declared Content-Length, within the limit
	mu    sync.Mutex
	buf   []byte
	ended bool // read to its end within the limit
	over  bool // past the limit: nothing kept
}

func (b *keptBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.mu.Lock()
	b.keep(p[:n], err)
	b.mu.Unlock()
	return n, err
}

// keep adds what a read returned; b.mu is held.
func (b *keptBody) keep(p []byte, err error) {
	if b.over {
		return
	}
	if len(b.buf)+len(p) > b.limit {
		b.over, b.buf = true, nil
		return
	}
	b.buf = append(b.buf, p...)
	if err == io.EOF {
		b.ended = true
	}
}

// replay returns the body again for a retry (GetBody).
func (b *keptBody) replay() (io.ReadCloser, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.ended && !b.over && b.known {
		rest, err := io.ReadAll(io.LimitReader(b.ReadCloser, int64(b.limit-len(b.buf))+1))
		if err == nil {
			err = io.EOF
		}
		b.keep(rest, err)
	}
	if !b.ended {
		return nil, errNotKept
	}
	return io.NopCloser(bytes.NewReader(b.buf)), nil
}
