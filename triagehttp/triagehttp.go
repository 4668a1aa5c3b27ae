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
package triagehttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/internal/reqctx"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/trust"
	"github.com/triagehq/triage/wire"
)

// Canonical header names of the wire keys (see package wire), so lookups do
// not canonicalize on every request. TestHeaderNames checks them.
const (
	criticalityHeader = "Triage-Criticality"
	decayHeader       = "Triage-Criticality-Decay"
	attemptHeader     = "Triage-Attempt"
	customerHeader    = "Triage-Customer"
	outcomeHeader     = "Triage-Outcome"
	retryAfterHeader  = "Retry-After"
)

// Option configures the middleware.
type Option interface{ apply(*config) }

type config struct {
	trust      *trust.Policy
	classifier *edge.Classifier
	group      func(*http.Request) string
	admission  *admission.Controller
	customerID bool
	quota      *quota.Enforcer
	meter      *cost.Meter
	clock      clock.Clock
	iso        *isolate.Table
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithTrust sets the peers whose triage headers are believed. Default: none.
func WithTrust(p *trust.Policy) Option { return optionFunc(func(c *config) { c.trust = p }) }

// WithClassifier sets the criticality rules. Default: edge.HeaderOnly()
// (believe a trusted peer's header, else CRITICAL).
func WithClassifier(cl *edge.Classifier) Option {
	return optionFunc(func(c *config) { c.classifier = cl })
}

// WithGroup supplies the user-group function for group rules, e.g. one that
// reads the authenticated user's plan. It is called only when the
// classifier has a group rule. Default: no group.
func WithGroup(f func(*http.Request) string) Option {
	return optionFunc(func(c *config) { c.group = f })
}

// WithCustomerFromIdentity makes the peer's verified mTLS identity (its
// first URI SAN, else DNS SAN) the customer of requests without a trusted
// Triage-Customer header (quota.CustomerOf). Default: only a trusted
// peer's header names a customer.
func WithCustomerFromIdentity() Option {
	return optionFunc(func(c *config) { c.customerID = true })
}

// WithIsolation names each request's client type from its Host
// (isolate.Table.ClientFor) and puts it in the request context
// (isolate.ClientOf), where the "triage" gRPC balancer routes by it
// (triagegrpc.WithBalancerIsolation); a client type the table black-holes
// is answered at once, 503 "overloaded; don't retry", before any other
// work. Default: none.
func WithIsolation(t *isolate.Table) Option { return optionFunc(func(c *config) { c.iso = t }) }

// errBlackHole answers a black-holed client type.
var errBlackHole = &outcome.Error{Kind: outcome.DontRetry, Reason: "client type black-holed"}

// WithClock sets the clock that starts criticality decays (edge rules
// with a decay). Default clock.Real(); give the admission controller the
// same one.
func WithClock(clk clock.Clock) Option { return optionFunc(func(c *config) { c.clock = clk }) }

// WithAdmission installs admission control: before the handler runs, the
// request must be admitted (admission.Controller.Arrive, with the request
// context's deadline) and get an execution slot (Start); a rejected
// request is answered 503 with Triage-Outcome and never reaches the
// handler. Default: none.
func WithAdmission(ctl *admission.Controller) Option {
	return optionFunc(func(c *config) { c.admission = ctl })
}

// WithQuota installs per-customer quotas: before admission control, the
// request's customer (quota.CustomerOf) must be within its quota on this
// task (quota.Enforcer.Admit), else it is answered 429 with
// Triage-Outcome: out-of-quota and Retry-After: 1, and never reaches the
// handler; the handler's CPU is measured with m (package cost) and charged
// to the customer in e's Usage. Calls the handler makes through a
// Transport, or through triage's gRPC client, are marked as waits
// (cost.TrackerFrom). Default: none.
func WithQuota(e *quota.Enforcer, m *cost.Meter) Option {
	return optionFunc(func(c *config) { c.quota, c.meter = e, m })
}

// Middleware returns the edge middleware. For every request it decides
// whether the peer is trusted, strips triage headers of untrusted peers,
// assigns criticality by the classifier's rules, and puts the criticality
// and the received attempt counter in the request's context
// (criticality.Of, attempt.Incoming). The returned func is safe for
// concurrent use.
func Middleware(opts ...Option) (func(http.Handler) http.Handler, error) {
	var c config
	for _, o := range opts {
		o.apply(&c)
	}
	if c.classifier == nil {
		cl, err := edge.New(edge.HeaderOnly())
		if err != nil {
			return nil, fmt.Errorf("triagehttp: %w", err)
		}
		c.classifier = cl
	}
	if (c.quota == nil) != (c.meter == nil) {
		return nil, errors.New("triagehttp: WithQuota needs both an Enforcer and a cost Meter")
	}
	plain := c.admission == nil && c.quota == nil
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r, d, cancel := c.classify(r)
			if cancel != nil {
				defer cancel()
			}
			if c.blackHoled(r) {
				WriteError(w, errBlackHole)
				return
			}
			if plain {
				next.ServeHTTP(w, r)
				return
			}
			ctx := r.Context()
			customer := quota.CustomerOf(ctx)
			var res quota.Reservation
			if c.quota != nil {
				var err error
				if res, err = c.quota.Reserve(customer, d.Level); err != nil {
					WriteError(w, err)
					return
				}
			}
			if c.admission != nil {
				deadline, _ := ctx.Deadline()
				var tk admission.Ticket
				err := c.admission.Arrive(&tk, d.Level, attempt.Incoming(ctx), deadline)
				if err == nil {
					defer c.admission.Done(&tk)
					err = c.admission.Start(ctx, &tk)
				}
				if err != nil {
					if c.quota != nil {
						c.quota.Cancel(customer, res)
					}
					if !WriteError(w, err) {
						w.WriteHeader(http.StatusServiceUnavailable) // the caller went away while waiting
					}
					return
				}
			}
			if c.quota != nil {
				t := new(cost.Tracker)
				t.Start(c.meter)
				r = r.WithContext(cost.NewContext(ctx, t))
				defer func() { c.quota.Done(customer, d.Level, res, t.Stop()) }()
			}
			next.ServeHTTP(w, r)
		})
	}, nil
}

// classify strips, classifies and decodes r, and returns it with the
// request context. A decay (the matching rule's, started now, or a trusted
// upstream's from the Triage-Criticality-Decay header) goes into the
// context, and the decision's level is the current one; a rule that
// cancels at its decay sets the deadline instead, and cancel must be
// called when the request ends.
func (c *config) classify(r *http.Request) (*http.Request, edge.Decision, context.CancelFunc) {
	p := PeerOf(r)
	trusted := c.trust.Trusted(p)
	req := edge.Request{Trusted: trusted, Host: r.Host, Path: r.URL.Path}
	n, customer, decayWire := 0, "", ""
	if trusted {
		req.Header = single(r.Header, criticalityHeader)
		if v := single(r.Header, attemptHeader); v != "" {
			n, _ = attempt.Parse(v)
		}
		if v := single(r.Header, customerHeader); len(v) <= wire.CustomerMaxLen {
			customer = quota.Customer(v)
		}
		decayWire = single(r.Header, decayHeader)
	} else {
		strip(r.Header, c.classifier.Observer())
	}
	if c.group != nil && c.classifier.NeedsGroup() {
		req.Group = c.group(r)
	}
	if customer == "" && c.customerID && len(p.Identities) > 0 {
		customer = quota.Customer(p.Identities[0])
	}
	d := c.classifier.Classify(&req)
	ctx := reqctx.WithRequest(r.Context(), uint8(d.Level), uint8(n), customer)
	if c.iso != nil {
		if ct := c.iso.ClientFor(r.Host); ct != "" {
			ctx = isolate.NewContext(ctx, ct)
		}
	}
	var cancel context.CancelFunc
	switch {
	case d.Decay.Cancel:
		ctx, cancel = context.WithDeadline(ctx, clock.OrReal(c.clock).Now().Add(d.Decay.After))
	case d.Decay.After > 0:
		ctx = criticality.WithDecay(ctx, criticality.Decay{At: clock.OrReal(c.clock).Now().Add(d.Decay.After), To: d.Decay.To})
	case decayWire != "" && d.Rule == edge.Header:
		now := clock.OrReal(c.clock).Now()
		if dc, err := criticality.ParseDecay(decayWire, now); err == nil {
			ctx = criticality.WithDecay(ctx, dc)
			d.Level, _ = criticality.Current(ctx, now)
		}
	}
	return r.WithContext(ctx), d, cancel
}

// blackHoled reports whether r's client type is black-holed.
func (c *config) blackHoled(r *http.Request) bool {
	return c.iso != nil && c.iso.RouteOf(isolate.ClientOf(r.Context())) == isolate.BlackHole
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

// strip deletes every triage header, reporting each to obs.
func strip(h http.Header, obs edge.Observer) {
	for k := range h {
		if !wire.IsTriage(k) {
			continue
		}
		if key, ok := wire.Lookup(k); ok {
			obs.Stripped(key.Name)
		} else {
			obs.Stripped("unregistered")
		}
		delete(h, k)
	}
}

// PeerOf returns what the server knows about the caller: the IP address of
// r.RemoteAddr and, when the TLS client certificate was verified, its URI
// and DNS SANs.
func PeerOf(r *http.Request) trust.Peer {
	var p trust.Peer
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		p.Addr = ap.Addr().Unmap()
	}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
		leaf := r.TLS.VerifiedChains[0][0]
		for _, u := range leaf.URIs {
			p.Identities = append(p.Identities, u.String())
		}
		p.Identities = append(p.Identities, leaf.DNSNames...)
	}
	return p
}

// Transport is an http.RoundTripper that writes the request context's
// criticality (criticality.Of) and outgoing attempt counter
// (attempt.Outgoing) into the request headers, replacing any triage headers
// already there, and, with a Policy, applies the client-side defences of
// package retry: adaptive throttling, up to three attempts of a request the
// backend answered "task overloaded" (503 with Triage-Outcome), the
// per-client retry budget and backoff. It is safe for concurrent use.
//
// With a Policy, RoundTrip returns:
//   - the response, when the Policy did not have to give up (a success, any
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
// like a new request. Use one Transport (one Policy) per backend service.
type Transport struct {
	// Base makes the request; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Policy is the retry and throttling policy; nil propagates headers only.
	Policy *retry.Policy
	// Clock reads the time left before a criticality decay
	// (criticality.WithDecay), sent in Triage-Criticality-Decay. Nil
	// means the real clock.
	Clock clock.Clock
}

// RoundTrip implements http.RoundTripper. The caller's request is not
// modified: headers are set on a clone.
func (t *Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	tr := cost.TrackerFrom(r.Context()) // the handler's request, if any, waits meanwhile
	tr.Wait()
	defer tr.Resume()
	if t.Policy == nil {
		return base.RoundTrip(withHeaders(r, r.Context(), t.Clock))
	}
	var resp *http.Response
	first := true
	call := func(ctx context.Context) error {
		out := withHeaders(r, ctx, t.Clock)
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
				// The Policy decides: retry or give up. Either way this
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
	}
	var err error
	if r.Body != nil && r.Body != http.NoBody && r.GetBody == nil {
		err = t.Policy.DoOnce(r.Context(), call)
	} else {
		err = t.Policy.Do(r.Context(), call)
	}
	if resp != nil {
		return resp, nil
	}
	if err == nil {
		err = errors.New("triagehttp: no response") // unreachable: a nil error always comes with a response
	}
	return nil, err
}

// withHeaders clones r for ctx with the triage headers of ctx
// (criticality as of now, its decay if still ahead, attempt, and the
// customer when there is one).
func withHeaders(r *http.Request, ctx context.Context, clk clock.Clock) *http.Request {
	out := r.Clone(ctx)
	for k := range out.Header {
		if wire.IsTriage(k) {
			delete(out.Header, k)
		}
	}
	level := criticality.Of(ctx)
	if dc, ok := criticality.DecayOf(ctx); ok {
		now := clock.OrReal(clk).Now()
		if level, _ = criticality.Current(ctx, now); level > dc.To {
			out.Header[decayHeader] = []string{criticality.FormatDecay(dc, now)}
		}
	}
	out.Header[criticalityHeader] = []string{level.String()}
	out.Header[attemptHeader] = []string{attempt.Format(attempt.Outgoing(ctx))}
	if cu := quota.CustomerOf(ctx); cu != "" && len(cu) <= wire.CustomerMaxLen {
		out.Header[customerHeader] = []string{cu}
	}
	return out
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
