package triagehttp

import (
	"context"
	"errors"
	"io"
	"net/http"

	"github.com/triagehq/triage/egress"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/wire"
)

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
	delete(h, attemptHeader)
	delete(h, decayHeader)
	delete(h, customerHeader)
	var buf [8]string
	kv := k.Pairs(buf[:0])
	for i := 0; i < len(kv); i += 2 {
		h[wire.Header(kv[i])] = []string{kv[i+1]}
	}
}
