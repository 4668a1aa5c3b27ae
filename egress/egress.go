// Package egress is the path every outgoing call takes out of a triage
// client, written once for every transport: which hosts may receive
// triage's keys, what a call carries at a given moment (criticality and
// its decay, attempt, customer), the retry policy of the call's client type
// and the cancellation of its calls when isolation moves that type, and
// the marking of the calling request's wait (package cost).
//
// A Caller models the client side of one backend service. A transport
// adapter (triagegrpc's Client interceptors, triagehttp's Transport) calls
// Begin for each outgoing call with the host it is addressed to, runs its
// attempts with Call.Do (or Call.Start for a stream, which is never
// retried), writes each attempt's Keys in its own spelling, and calls
// Call.End when the call is over. The adapters keep only what is theirs:
// metadata or headers, status or response decoding, body replay.
//
// The zero value is not usable; call New. A Caller is safe for concurrent
// use. The throttle and the retry budget keep statistics of one backend
// service, so use one Caller per backend service, shared by every
// connection and transport to it. Its memory is bounded: its Policies'
// windows, the host patterns it was given (at most MaxHosts), and one
// entry per client type the isolation table names (isolate.MaxClients).
package egress

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/internal/hostport"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/retry"
)

// MaxHosts bounds the host patterns of WithInternal.
const MaxHosts = 1024

// Caller is the client side of one backend service. Create one with New.
type Caller struct {
	policy *retry.Policy // nil: propagation only
	sacPol *retry.Policy // the sacrificial route's, with isolation
	clock  clock.Clock
	hosts  hosts
	iso    *isolate.Table
	unsub  func()

	// gens holds, per client type, a context cancelled when the type's
	// route changes: calls in flight of that type are cancelled with it.
	gens   atomic.Pointer[map[string]routeGen]
	gensMu sync.Mutex // held to replace gens
}

type routeGen struct {
	route  isolate.Route
	ctx    context.Context
	cancel context.CancelFunc
}

// Option configures a Caller.
type Option interface{ apply(*config) }

type config struct {
	policy   *retry.Policy
	noPolicy bool
	clock    clock.Clock
	hosts    []string
	iso      *isolate.Table
	sacPol   *retry.Policy
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithPolicy sets the retry and throttling policy. Default: retry.New()
// with the book's defaults (K = 2 over two minutes, 3 attempts, a 10%
// retry budget).
func WithPolicy(p *retry.Policy) Option {
	return optionFunc(func(c *config) { c.policy, c.noPolicy = p, p == nil })
}

// WithoutPolicy makes the Caller propagate keys only: no throttling, no
// retries.
func WithoutPolicy() Option {
	return optionFunc(func(c *config) { c.policy, c.noPolicy = nil, true })
}

// WithInternal names the hosts that receive triage's keys; calls to any
// other host carry none (criticality, customer names and attempt counts
// are nobody else's business). A pattern matches a host exactly
// (case-insensitive; a port and a trailing dot are ignored), ".suffix"
// matches every host under it (".svc.cluster.local"), and "*" matches
// every host, for a Caller whose calls go only to the operator's own
// backends. The host of a call is the one its adapter gives Begin: the
// request URL's for HTTP, the dial target's for gRPC. Default: none.
// Later calls add to the list.
func WithInternal(patterns ...string) Option {
	return optionFunc(func(c *config) { c.hosts = append(c.hosts, patterns...) })
}

// WithIsolation gives the calls of client types that t routes to the
// sacrificial backends (isolate.Sacrificial) a policy of their own,
// sacrificial (nil: retry.New() with the book's defaults), so that
// sacrificial backends, which may be overloaded, neither throttle the other
// client types' calls nor spend their retry budget; and it cancels the
// calls in flight of a client type when t moves its route. The client
// type of a call is isolate.ClientOf of its context. Without a Policy
// (WithoutPolicy) it changes nothing. The Caller follows t until Close.
func WithIsolation(t *isolate.Table, sacrificial *retry.Policy) Option {
	return optionFunc(func(c *config) { c.iso, c.sacPol = t, sacrificial })
}

// WithClock sets the clock that reads the time left before a call's
// criticality decays (criticality.WithDecay), and that of the default
// policies (WithPolicy, WithIsolation). Default clock.Real().
func WithClock(clk clock.Clock) Option {
	return optionFunc(func(c *config) { c.clock = clk })
}

// New returns a Caller, or an error for a nil option or a bad host
// pattern.
func New(opts ...Option) (*Caller, error) {
	var cfg config
	for i, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("egress: option %d is nil", i)
		}
		o.apply(&cfg)
	}
	h, err := parseHosts(cfg.hosts)
	if err != nil {
		return nil, err
	}
	c := &Caller{policy: cfg.policy, hosts: h, clock: clock.OrReal(cfg.clock)}
	if c.policy == nil && !cfg.noPolicy {
		if c.policy, err = retry.New(retry.WithClock(c.clock)); err != nil {
			return nil, fmt.Errorf("egress: default policy: %w", err)
		}
	}
	if cfg.iso != nil && c.policy != nil {
		c.iso, c.sacPol = cfg.iso, cfg.sacPol
		if c.sacPol == nil {
			if c.sacPol, err = retry.New(retry.WithClock(c.clock)); err != nil {
				return nil, fmt.Errorf("egress: default sacrificial policy: %w", err)
			}
		}
		c.gens.Store(&map[string]routeGen{})
		c.unsub = c.iso.Subscribe(c.routesChanged)
	}
	return c, nil
}

// Policy returns the Caller's policy, nil without one.
func (c *Caller) Policy() *retry.Policy { return c.policy }

// Internal reports whether calls to host receive triage's keys
// (WithInternal).
func (c *Caller) Internal(host string) bool { return c.hosts.match(host) }

// Close stops following the isolation table; calls begun later are not
// cancelled when a route changes. It is safe to call more than once.
func (c *Caller) Close() {
	c.gensMu.Lock()
	defer c.gensMu.Unlock()
	if c.unsub != nil {
		c.unsub()
		c.unsub = nil
	}
}

// routesChanged cancels the calls in flight of every client type whose
// route changed: a client type moved to the sacrificial backends (or
// black-holed) leaves the shared ones at once, with the requests it has
// queued there.
func (c *Caller) routesChanged() {
	c.gensMu.Lock()
	defer c.gensMu.Unlock()
	old := *c.gens.Load()
	next := make(map[string]routeGen, len(old))
	for ct, g := range old {
		if c.iso.RouteOf(ct) != g.route {
			g.cancel()
			continue
		}
		next[ct] = g
	}
	c.gens.Store(&next)
}

// generation returns ct's current generation, adding it if the table has
// room (bounded by isolate.MaxClients: past it, a call is not cancelled
// on a route change).
func (c *Caller) generation(ct string) routeGen {
	if g, ok := (*c.gens.Load())[ct]; ok {
		return g
	}
	c.gensMu.Lock()
	defer c.gensMu.Unlock()
	cur := *c.gens.Load()
	if g, ok := cur[ct]; ok {
		return g
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := routeGen{route: c.iso.RouteOf(ct), ctx: ctx, cancel: cancel}
	if len(cur) >= isolate.MaxClients {
		return g
	}
	next := make(map[string]routeGen, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	next[ct] = g
	c.gens.Store(&next)
	return g
}

// hosts is a parsed WithInternal list.
type hosts struct {
	all      bool
	exact    []string // lower case
	suffixes []string // lower case, each starting with "."
}

var errHosts = errors.New("egress: bad internal host pattern")

func parseHosts(patterns []string) (hosts, error) {
	var h hosts
	if len(patterns) > MaxHosts {
		return h, fmt.Errorf("%w: %d patterns, at most %d", errHosts, len(patterns), MaxHosts)
	}
	for _, p := range patterns {
		switch {
		case p == "*":
			h.all = true
		case p == "" || strings.ContainsAny(p, " \t\r\n/*@?#"):
			return h, fmt.Errorf("%w: %q (a host, .suffix or *)", errHosts, p)
		case strings.HasPrefix(p, "."):
			s := strings.ToLower(strings.TrimSuffix(p, "."))
			if len(s) < 2 {
				return h, fmt.Errorf("%w: %q names no domain", errHosts, p)
			}
			h.suffixes = append(h.suffixes, s)
		default:
			e := strings.ToLower(hostport.Host(p))
			if e == "" {
				return h, fmt.Errorf("%w: %q names no host", errHosts, p)
			}
			h.exact = append(h.exact, e)
		}
	}
	return h, nil
}

// match reports whether host (a host, host:port, or [v6]:port) matches.
// It does not allocate.
func (h *hosts) match(host string) bool {
	if h.all {
		return true
	}
	host = hostport.Host(host)
	if host == "" {
		return false
	}
	for _, e := range h.exact {
		if strings.EqualFold(host, e) {
			return true
		}
	}
	for _, s := range h.suffixes {
		if len(host) > len(s) && strings.EqualFold(host[len(host)-len(s):], s) {
			return true
		}
	}
	return false
}
