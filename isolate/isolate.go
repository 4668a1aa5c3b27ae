// Package isolate keeps one type of client away from the others: the CRE
// post's per-client hostnames ("every type of client accesses the service
// through its own hostname. This allows us to isolate all traffic from a
// badly-behaved client") and its three remedies for a rogue: route it to
// servers with spare capacity, "designate a subset of servers to handle
// the bad client traffic as best as they can, accepting that they'll
// likely become overloaded, and keep traffic from other clients away from
// those hosts", or black-hole it.
//
// A Table maps hostnames to client types and client types to a Route, and
// names the sacrificial backends. The operator changes it at runtime with
// Set (or a reloaded file, triageyaml.WatchIsolation): the adapters read
// it on every request, so a switch takes effect with the next request,
// without a restart and without dropping a connection. The HTTP
// middleware and the gRPC tap, given intake.WithIsolation, name the client type from the request's host
// and black-hole at the edge; the "triage" balancer
// (lb.WithIsolation) sends a sacrificial client type only
// to the sacrificial backends and every other client type only to the
// rest. Criticality can key on the same hostnames (package edge's host
// rules).
package isolate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/triagehq/triage/internal/hostport"
	"github.com/triagehq/triage/outcome"
)

// Route is where a client type's requests go.
type Route uint8

const (
	// Shared (the default): the backends that are not sacrificial.
	Shared Route = iota
	// Sacrificial: only the sacrificial backends, which may overload; the
	// other client types never reach them.
	Sacrificial
	// BlackHole: nowhere. The request is refused where the client type is
	// first known, as "overloaded; don't retry".
	BlackHole
)

var routeNames = [...]string{"shared", "sacrificial", "black-hole"}

// String returns "shared", "sacrificial" or "black-hole".
func (r Route) String() string {
	if int(r) < len(routeNames) {
		return routeNames[r]
	}
	return fmt.Sprintf("Route(%d)", uint8(r))
}

// ParseRoute parses a Route's name; "" is Shared.
func ParseRoute(s string) (Route, error) {
	if s == "" {
		return Shared, nil
	}
	for i, n := range routeNames {
		if s == n {
			return Route(i), nil
		}
	}
	return 0, fmt.Errorf("isolate: unknown route %q (want shared, sacrificial or black-hole)", s)
}

// Bounds on a Config.
const (
	MaxClients     = 1024 // client types
	MaxHosts       = 4096 // hostnames over all client types
	MaxSacrificial = 1024 // sacrificial backends
	MaxNameLen     = 64   // a client type's name
)

// Config is a Table's serializable form.
type Config struct {
	// Clients are the client types, each with its hostnames.
	Clients []Client `yaml:"clients" json:"clients"`
	// Sacrificial are the addresses ("host:port", as the resolver gives
	// them) of the backends that serve sacrificial client types.
	Sacrificial []string `yaml:"sacrificial" json:"sacrificial"`
}

// Client is one client type.
type Client struct {
	// Name names the client type: 1-64 bytes of [A-Za-z0-9._-].
	Name string `yaml:"name" json:"name"`
	// Hosts are the hostnames it reaches the service through, matched
	// exactly (case-insensitively, port and trailing dot ignored).
	Hosts []string `yaml:"hosts" json:"hosts"`
	// Route is "shared" (default), "sacrificial" or "black-hole".
	Route string `yaml:"route,omitempty" json:"route,omitempty"`
}

// ErrConfig is wrapped by every error New and Set return.
var ErrConfig = errors.New("isolate: invalid config")

// Table is the isolation in force. It is safe for concurrent use; a
// lookup is one atomic load and one map read, and allocates nothing.
// Bounded by MaxClients, MaxHosts and MaxSacrificial.
type Table struct {
	cur atomic.Pointer[table]

	mu   sync.Mutex
	subs map[int]func()
	next int
}

type table struct {
	cfg         Config
	hosts       map[string]string // lower-case host -> client type
	routes      map[string]Route
	sacrificial map[string]struct{}
	version     uint64
}

// New validates c and returns a Table.
func New(c Config) (*Table, error) {
	tb, err := compile(c, 1)
	if err != nil {
		return nil, err
	}
	t := &Table{}
	t.cur.Store(tb)
	return t, nil
}

// Set validates c and puts it in force for the next request. A bad c is
// refused with an error and the Table keeps the config it had.
func (t *Table) Set(c Config) error {
	tb, err := compile(c, t.cur.Load().version+1)
	if err != nil {
		return err
	}
	t.cur.Store(tb)
	t.mu.Lock()
	subs := make([]func(), 0, len(t.subs))
	for _, f := range t.subs {
		subs = append(subs, f)
	}
	t.mu.Unlock()
	for _, f := range subs {
		f()
	}
	return nil
}

// Subscribe calls f after every Set that puts a new config in force, on
// Set's goroutine, until the returned func is called. triagegrpc's Client
// uses it to cancel the calls in flight of a client type whose route
// changed.
func (t *Table) Subscribe(f func()) (unsubscribe func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.subs == nil {
		t.subs = map[int]func(){}
	}
	id := t.next
	t.next++
	t.subs[id] = f
	return func() {
		t.mu.Lock()
		delete(t.subs, id)
		t.mu.Unlock()
	}
}

// Config returns the config in force.
func (t *Table) Config() Config { return t.cur.Load().cfg }

// Version counts the configs put in force (1 for New's); the balancer
// re-partitions its backends when it changes.
func (t *Table) Version() uint64 { return t.cur.Load().version }

// ClientFor returns the client type whose hostname host is ("" for none).
// host may carry a port.
func (t *Table) ClientFor(host string) string {
	return t.cur.Load().hosts[normalHost(host)]
}

// RouteOf returns client's route (Shared for "" and unknown types).
func (t *Table) RouteOf(client string) Route {
	if client == "" {
		return Shared
	}
	return t.cur.Load().routes[client]
}

// IsSacrificial reports whether the backend at addr is sacrificial.
func (t *Table) IsSacrificial(addr string) bool {
	_, ok := t.cur.Load().sacrificial[addr]
	return ok
}

func compile(c Config, version uint64) (*table, error) {
	bad := func(f string, a ...any) (*table, error) {
		return nil, fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(f, a...))
	}
	if len(c.Clients) > MaxClients {
		return bad("%d clients, at most %d", len(c.Clients), MaxClients)
	}
	if len(c.Sacrificial) > MaxSacrificial {
		return bad("%d sacrificial backends, at most %d", len(c.Sacrificial), MaxSacrificial)
	}
	tb := &table{hosts: map[string]string{}, routes: map[string]Route{}, sacrificial: map[string]struct{}{}, version: version}
	nhosts := 0
	for i, cl := range c.Clients {
		if err := validName(cl.Name); err != nil {
			return bad("client %d: %v", i+1, err)
		}
		if _, dup := tb.routes[cl.Name]; dup {
			return bad("client %q named twice", cl.Name)
		}
		r, err := ParseRoute(cl.Route)
		if err != nil {
			return bad("client %q: %v", cl.Name, err)
		}
		tb.routes[cl.Name] = r
		if len(cl.Hosts) == 0 {
			return bad("client %q has no hosts", cl.Name)
		}
		for _, h := range cl.Hosts {
			if nhosts++; nhosts > MaxHosts {
				return bad("more than %d hosts", MaxHosts)
			}
			n := normalHost(h)
			if n == "" || n != strings.ToLower(strings.TrimSuffix(h, ".")) || strings.ContainsAny(n, "*/ @") {
				return bad("client %q: host %q: want a host name without port or wildcard", cl.Name, h)
			}
			if other, dup := tb.hosts[n]; dup {
				return bad("host %q belongs to %q and %q", h, other, cl.Name)
			}
			tb.hosts[n] = cl.Name
		}
	}
	for _, a := range c.Sacrificial {
		if a == "" || len(a) > 256 || strings.ContainsAny(a, " /") {
			return bad("sacrificial backend %q: want host:port", a)
		}
		tb.sacrificial[a] = struct{}{}
	}
	tb.cfg = Config{Clients: append([]Client(nil), c.Clients...), Sacrificial: append([]string(nil), c.Sacrificial...)}
	return tb, nil
}

func validName(s string) error {
	if s == "" || len(s) > MaxNameLen {
		return fmt.Errorf("name %q: want 1-%d bytes", s, MaxNameLen)
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("name %q: want [A-Za-z0-9._-]", s)
		}
	}
	return nil
}

// normalHost lower-cases host and drops a port and a trailing dot. It
// allocates only for upper-case input.
func normalHost(h string) string {
	h = hostport.Host(h)
	for i := 0; i < len(h); i++ {
		if c := h[i]; c >= 'A' && c <= 'Z' {
			return strings.ToLower(h)
		}
	}
	return h
}

type clientKey struct{}

// NewContext returns a child of ctx for a request of client type client.
func NewContext(ctx context.Context, client string) context.Context {
	return context.WithValue(ctx, clientKey{}, client)
}

// ClientOf returns the client type of ctx's request, "" if unknown.
func ClientOf(ctx context.Context) string {
	c, _ := ctx.Value(clientKey{}).(string)
	return c
}

// ErrBlackHoled is the outcome of a request whose client type the table
// black-holes, wherever it is refused (the caller's egress, the balancer,
// the server's intake): overloaded; don't retry. It is shared; do not
// modify it.
var ErrBlackHoled = &outcome.Error{Kind: outcome.DontRetry, Reason: "client type black-holed"}

type routeKey struct{}

// NewRouteContext returns a child of ctx for a call whose route was
// decided as r: the caller decides it once (package egress), and the
// balancer follows it.
func NewRouteContext(ctx context.Context, r Route) context.Context {
	return context.WithValue(ctx, routeKey{}, r)
}

// RouteFrom returns the route decided for ctx's call, if one was.
func RouteFrom(ctx context.Context) (Route, bool) {
	r, ok := ctx.Value(routeKey{}).(Route)
	return r, ok
}
