// Package lb is triage's gRPC load balancer, "triage": subsetting over the
// resolved endpoints (package subset: 20 backends by default, a failing
// member replaced for as long as it fails, one in lame duck at once),
// grpc-go's endpointsharding with a
// pick_first child and health checking per endpoint, and a picker over a
// balance.Balancer: flow control, lame duck (from health checks and from
// the triage-lame-duck trailer), round robin, least loaded or weighted
// round robin from the backends' ORCA load reports, and isolation of
// sacrificial client types.
//
// Register it once, from main, before dialing; a service config selects it
// by Name. Its configuration (Config) comes from the service config and is
// parsed strictly (ParseConfig). Each ClientConn gets its own
// balance.Balancer, bounded by the endpoints of its subset and its
// replacements, and one goroutine, which brings a replacement in when it
// falls due and ends when grpc-go closes the balancer.
package lb

import (
	"cmp"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/endpointsharding"
	"google.golang.org/grpc/balancer/pickfirst"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"

	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/subset"
)

// Name is the name under which Register registers triage's
// load balancer, for the service config's loadBalancingConfig:
//
//	{"loadBalancingConfig": [{"triage": {
//	    "policy": "weighted_round_robin",
//	    "subsetSize": 20, "clientId": 7}}]}
const Name = "triage"

// Register registers the "triage" load balancer with grpc-go, so
// that a service config can select it. grpc-go's registry is global and
// not safe to change while any ClientConn runs: call it once, from main,
// before dialing (a second call replaces the first). Triage registers
// nothing by itself. A process whose ClientConns report to different
// Trackers registers once without WithMetrics and gives each its own with
// WithTracker.
func Register(opts ...Option) {
	var b balancerBuilder
	for _, o := range opts {
		o.apply(&b)
	}
	balancer.Register(b)
}

// WithTracker returns s with t as the Tracker of the balancers built for
// the ClientConn whose resolver reports s, in place of the one Register
// was given (for a resolver the caller writes, such as grpc-go's manual
// one). A nil t leaves s as it is.
func WithTracker(s resolver.State, t Tracker) resolver.State {
	if t != nil {
		s.Attributes = s.Attributes.WithValue(trackerKey{}, t)
	}
	return s
}

type trackerKey struct{}

// trackerOf is the Tracker WithTracker put in s, or nil.
func trackerOf(s resolver.State) Tracker {
	t, _ := s.Attributes.Value(trackerKey{}).(Tracker)
	return t
}

// Option configures Register.
type Option interface{ apply(*balancerBuilder) }

type optionFunc func(*balancerBuilder)

func (f optionFunc) apply(b *balancerBuilder) { f(b) }

// Tracker follows the balancers the "triage" policy creates, one
// per ClientConn (and per configuration change), for metrics;
// triageprom.BalancerMetrics is one.
type Tracker interface {
	Observer(target string) balance.Observer
	Add(target string, b *balance.Balancer)
	Remove(b *balance.Balancer)
}

// WithMetrics reports every balancer to t. Default: none.
func WithMetrics(t Tracker) Option {
	return optionFunc(func(b *balancerBuilder) { b.tracker = t })
}

// WithIsolation routes each call by its client type
// (isolate.ClientOf, set by intake.WithIsolation in the HTTP middleware
// or the gRPC server at the edge): a client type routed Sacrificial
// goes only to the backends t names sacrificial, every other one only to
// the rest, and a black-holed one fails at once with "overloaded; don't
// retry". A change to t takes effect at the next pick, on connections
// already open. Default: none (every backend serves every client type).
func WithIsolation(t *isolate.Table) Option {
	return optionFunc(func(b *balancerBuilder) { b.isolation = t })
}

type balancerBuilder struct {
	tracker   Tracker
	isolation *isolate.Table
}

func (balancerBuilder) Name() string { return Name }

// ParseConfig parses the balancer's JSON configuration strictly: unknown
// fields, bad names and bad durations are errors.
func (balancerBuilder) ParseConfig(js json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	return ParseConfig(js)
}

func (bb balancerBuilder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	b := &triageBalancer{ClientConn: cc, tracker: bb.tracker, iso: bb.isolation, clientID: rand.IntN(1 << 30),
		wake: make(chan struct{}, 1), closed: make(chan struct{}), stopped: make(chan struct{}),
		oob: map[balancer.SubConn]func(){}, endpoints: map[string]*balance.Endpoint{}, oobPending: map[string]balance.Load{}}
	b.child = endpointsharding.NewBalancer(b, opts, balancer.Get(pickfirst.Name).Build, endpointsharding.Options{})
	go b.keep()
	return b
}

// triageBalancer applies subsetting to the resolved endpoints, lets
// endpointsharding run one pick_first child per endpoint of the subset
// (with client-side health checking when the service config enables it),
// and picks among the ready children with a balance.Balancer.
type triageBalancer struct {
	// The balancer.ClientConn endpointsharding reports to: everything
	// passes through to grpc's except UpdateState, where the picker is ours.
	balancer.ClientConn
	child balancer.Balancer

	tracker Tracker
	iso     *isolate.Table

	// childMu serializes the calls into child: grpc-go's, and keep's
	// when a subset member is replaced. child calls UpdateState back
	// within them, which takes only mu.
	childMu sync.Mutex
	// keep's wake-ups (capacity 1), Close's signal, and keep's end.
	wake, closed, stopped chan struct{}

	mu   sync.Mutex
	cfg  *Config
	core *balance.Balancer
	// The subset: the resolver's state, its endpoints by id, the keeper of
	// the members, and the members last given to child. clientID is the
	// configured one, else this balancer's random one.
	rs   resolver.State
	byID map[string]resolver.Endpoint
	// Out-of-band load reports: the listeners' stop functions by SubConn,
	// the core's endpoints by id (from apply), and the reports that came
	// before their endpoint existed (at most one per member).
	oob        map[balancer.SubConn]func()
	endpoints  map[string]*balance.Endpoint
	oobPending map[string]balance.Load
	keeper     *subset.Keeper
	members    []string
	states     map[string]connectivity.State // each child's, as observe last saw it
	clientID   int
	// With isolation: sac picks among the sacrificial backends, core among
	// the rest; children is the last state of every endpoint, from which
	// a change of the isolation table re-partitions them.
	sac      *balance.Balancer
	children []endpointsharding.ChildState
	version  atomic.Uint64 // the isolation table's version last applied
}

func (b *triageBalancer) UpdateClientConnState(s balancer.ClientConnState) error {
	cfg, ok := s.BalancerConfig.(*Config)
	if !ok || cfg == nil {
		cfg, _ = ParseConfig([]byte("{}"))
	}
	b.childMu.Lock()
	defer b.childMu.Unlock()
	b.mu.Lock()
	if t := trackerOf(s.ResolverState); t != nil && b.core == nil {
		b.tracker = t
	}
	if b.core == nil || b.cfg == nil || !sameConfig(b.cfg, cfg) {
		opts := cfg.opts
		if b.tracker != nil {
			opts = append(slices.Clip(opts), balance.WithObserver(b.tracker.Observer(b.Target())))
		}
		core, err := balance.New(opts...)
		if err != nil {
			b.mu.Unlock()
			return err
		}
		var sac *balance.Balancer
		if b.iso != nil {
			if sac, err = balance.New(opts...); err != nil {
				b.mu.Unlock()
				return err
			}
		}
		if b.tracker != nil {
			for _, old := range []*balance.Balancer{b.core, b.sac} {
				if old != nil {
					b.tracker.Remove(old)
				}
			}
			b.tracker.Add(b.Target(), core)
			if sac != nil {
				b.tracker.Add(b.Target(), sac)
			}
		}
		b.core, b.sac = core, sac
	}
	if b.keeper == nil || !sameConfig(b.cfg, cfg) {
		client, size := b.clientID, cfg.SubsetSize
		if cfg.ClientID != nil {
			client = *cfg.ClientID
		}
		switch size {
		case 0:
			size = subset.DefaultSize
		case -1:
			size = 0 // every backend
		}
		b.keeper = subset.NewKeeper(cfg.alg, client, size, cfg.replaceAfter)
	}
	b.cfg = cfg
	eps := slices.Clone(s.ResolverState.Endpoints)
	slices.SortFunc(eps, func(x, y resolver.Endpoint) int { return cmp.Compare(endpointID(x), endpointID(y)) })
	ids := make([]string, len(eps))
	b.byID = make(map[string]resolver.Endpoint, len(eps))
	for i, e := range eps {
		ids[i] = endpointID(e)
		b.byID[ids[i]] = e
	}
	b.keeper.SetBackends(ids)
	b.rs = s.ResolverState
	b.members = nil
	b.mu.Unlock()
	return b.resubset()
}

// resubset gives child the keeper's members if they changed. The caller
// holds childMu.
func (b *triageBalancer) resubset() error {
	b.mu.Lock()
	now := time.Now()
	b.observe(now)
	members, next := b.keeper.Members(now)
	if b.members != nil && slices.Equal(members, b.members) {
		b.mu.Unlock()
		b.arm(next)
		return nil
	}
	b.members = members
	rs := b.rs
	rs.Endpoints = make([]resolver.Endpoint, len(members))
	for i, id := range members {
		rs.Endpoints[i] = b.byID[id]
	}
	b.mu.Unlock()
	b.arm(next)
	return b.child.UpdateClientConnState(balancer.ClientConnState{ResolverState: pickfirst.EnableHealthListener(rs)})
}

// observe tells the keeper each subset member's state: serving when it is
// ready and not in lame duck (a member that announced lame duck on a
// trailer while its connection stays ready keeps its replacement until
// the announcement expires); leaving when it goes from ready straight to
// failing, which only its health check does (a lost connection goes to
// idle first): the backend itself says it is not serving, as a task in
// lame duck does; failing otherwise. b.mu is held.
func (b *triageBalancer) observe(now time.Time) {
	lame := false
	defer func() {
		if lame {
			b.arm(time.Second) // look again: the announcement may have expired
		}
	}()
	was := b.states
	b.states = make(map[string]connectivity.State, len(b.children))
	for _, c := range b.children {
		id, st := endpointID(c.Endpoint), c.State.ConnectivityState
		b.states[id] = st
		switch st {
		case connectivity.Ready:
			if e := b.endpoints[id]; e == nil || e.State() != balance.LameDuck {
				b.keeper.Report(id, false, now)
			} else {
				lame = true
			}
		case connectivity.TransientFailure:
			if was[id] == connectivity.Ready {
				b.keeper.Leaving(id, now)
			} else {
				b.keeper.Report(id, true, now)
			}
		}
	}
}

// leaving is called when a backend announces lame duck on a trailer: a
// subset member's replacement is brought in at once.
func (b *triageBalancer) leaving(id string) {
	b.mu.Lock()
	k := b.keeper
	if k != nil {
		k.Leaving(id, time.Now())
	}
	b.mu.Unlock()
	if k != nil {
		b.poke()
	}
}

// arm wakes keep after d (0: no replacement pending).
func (b *triageBalancer) arm(d time.Duration) {
	if d <= 0 {
		return
	}
	time.AfterFunc(d, b.poke)
}

// poke wakes keep, at most one wake-up pending.
func (b *triageBalancer) poke() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// keep replaces failing subset members when their time comes, until
// Close: the only goroutine a balancer starts.
func (b *triageBalancer) keep() {
	defer close(b.stopped)
	for {
		select {
		case <-b.closed:
			return
		case <-b.wake:
		}
		b.childMu.Lock()
		select {
		case <-b.closed:
			b.childMu.Unlock()
			return
		default:
		}
		b.mu.Lock()
		ready := b.keeper != nil
		b.mu.Unlock()
		if ready {
			b.resubset()
		}
		b.childMu.Unlock()
	}
}

func endpointID(e resolver.Endpoint) string {
	if len(e.Addresses) == 0 {
		return ""
	}
	return e.Addresses[0].Addr
}

func (b *triageBalancer) ResolverError(err error) {
	b.childMu.Lock()
	defer b.childMu.Unlock()
	b.child.ResolverError(err)
}
func (b *triageBalancer) UpdateSubConnState(balancer.SubConn, balancer.SubConnState) {
}
func (b *triageBalancer) Close() {
	close(b.closed)
	<-b.stopped
	b.mu.Lock()
	for sc, stop := range b.oob {
		stop()
		delete(b.oob, sc)
	}
	b.mu.Unlock()
	b.childMu.Lock()
	b.child.Close()
	b.childMu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tracker != nil {
		for _, c := range []*balance.Balancer{b.core, b.sac} {
			if c != nil {
				b.tracker.Remove(c)
			}
		}
	}
}
func (b *triageBalancer) ExitIdle() {
	b.childMu.Lock()
	defer b.childMu.Unlock()
	b.child.ExitIdle()
}

// endpointData is what the picker keeps on each balance.Endpoint.
type endpointData struct {
	picker balancer.Picker
	e      *balance.Endpoint
	lame   func()                  // the endpoint announced lame duck
	done   func(balancer.DoneInfo) // for calls without a deadline
}

func (b *triageBalancer) UpdateState(s balancer.State) {
	children := endpointsharding.ChildStatesFromPicker(s.Picker)
	b.mu.Lock()
	if b.core == nil {
		b.mu.Unlock()
		b.ClientConn.UpdateState(s)
		return
	}
	b.children = children
	if b.keeper != nil {
		now := time.Now()
		b.observe(now)
		members, next := b.keeper.Members(now)
		if b.members != nil && !slices.Equal(members, b.members) {
			b.poke() // a member back: its replacement leaves
		}
		b.arm(next)
	}
	ready, ok := b.apply()
	core, sac := b.core, b.sac
	b.mu.Unlock()
	if !ok || ready == 0 {
		b.ClientConn.UpdateState(s) // connecting or failing: endpointsharding's picker says so
		return
	}
	b.ClientConn.UpdateState(balancer.State{ConnectivityState: connectivity.Ready, Picker: &picker{b: b, core: core, sac: sac}})
}

// apply hands the endpoints of b.children to the cores (to sac the
// sacrificial ones, with isolation) with their states, and returns how
// many are ready. b.mu is held.
func (b *triageBalancer) apply() (ready int, ok bool) {
	var version uint64
	if b.iso != nil {
		version = b.iso.Version()
	}
	type part struct {
		core *balance.Balancer
		ids  []string
		kids []endpointsharding.ChildState
	}
	parts := []*part{{core: b.core}}
	if b.sac != nil {
		parts = append(parts, &part{core: b.sac})
	}
	for _, c := range b.children {
		p := parts[0]
		if b.sac != nil && b.iso.IsSacrificial(endpointID(c.Endpoint)) {
			p = parts[1]
		}
		p.ids = append(p.ids, endpointID(c.Endpoint))
		p.kids = append(p.kids, c)
	}
	clear(b.endpoints)
	for _, p := range parts {
		eps, err := p.core.SetEndpoints(p.ids)
		if err != nil {
			return 0, false // duplicate ids cannot happen: endpointsharding dedups
		}
		for i, c := range p.kids {
			e := eps[i]
			b.endpoints[p.ids[i]] = e
			if l, ok := b.oobPending[p.ids[i]]; ok {
				e.Report(l)
				delete(b.oobPending, p.ids[i])
			}
			switch c.State.ConnectivityState {
			case connectivity.Ready:
				ready++
				e.Connected()
			default:
				e.SetState(balance.Refusing) // a new connection starts afresh
			}
			id := p.ids[i]
			lame := func() { b.leaving(id) }
			e.SetValue(&endpointData{picker: c.State.Picker, e: e, lame: lame, done: doneFunc(e, lame)})
		}
	}
	b.version.Store(version)
	return ready, true
}

// repartition re-partitions the endpoints if the isolation table changed
// since the last partition: one atomic load per pick otherwise.
func (b *triageBalancer) repartition() {
	if v := b.iso.Version(); v != b.version.Load() {
		b.mu.Lock()
		if b.iso.Version() != b.version.Load() {
			b.apply()
		}
		b.mu.Unlock()
	}
}

func (b *triageBalancer) isClosed() bool {
	select {
	case <-b.closed:
		return true
	default:
		return false
	}
}
