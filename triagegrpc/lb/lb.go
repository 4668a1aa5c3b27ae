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
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"
	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/endpointsharding"
	"google.golang.org/grpc/balancer/pickfirst"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/orca" // also parses endpoint-load-metrics-bin trailers into DoneInfo.ServerLoad
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/isolate"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/subset"
	"github.com/triagehq/triage/triagegrpc"
	"github.com/triagehq/triage/triagegrpc/internal/backenderr"
	"github.com/triagehq/triage/wire"
)

// Name is the name under which Register registers triage's
// load balancer, for the service config's loadBalancingConfig:
//
//	{"loadBalancingConfig": [{"triage": {
//	    "policy": "weighted_round_robin",
//	    "subsetSize": 20, "clientId": 7}}]}
const Name = "triage"

// Config is the JSON configuration of the "triage" balancer. Zero
// fields take the defaults of package balance and subset.
type Config struct {
	serviceconfig.LoadBalancingConfig `json:"-"`

	// Policy: round_robin (default), least_loaded or weighted_round_robin.
	Policy string `json:"policy,omitempty"`
	// SubsetSize is how many of the resolved backends this client
	// connects to (default subset.DefaultSize, 20; -1 means all).
	SubsetSize int `json:"subsetSize,omitempty"`
	// SubsetAlgorithm: deterministic (default), random or ringsteady.
	SubsetAlgorithm string `json:"subsetAlgorithm,omitempty"`
	// ClientID is this client task's index among the clients of the
	// service (the book's client_id). Without it, each balancer takes a
	// random one: subsets then spread like random subsetting's.
	ClientID *int `json:"clientId,omitempty"`
	// ReplaceAfter is how long a subset member must be failing (its
	// connection down or failing to connect) before a replacement joins
	// the subset, until it serves again ("1s" by default, at most 1m). A
	// member that says it is not serving, by its health check turning
	// NOT_SERVING while connected or by the triage-lame-duck trailer, is
	// replaced at once.
	ReplaceAfter string `json:"replaceAfter,omitempty"`
	// MaxActive is the flow-control cap per backend (default 100; -1
	// disables it).
	MaxActive int `json:"maxActive,omitempty"`
	// ErrorWindow, WeightPeriod, Blackout and Expiry are durations ("1s").
	ErrorWindow  string `json:"errorWindow,omitempty"`
	WeightPeriod string `json:"weightPeriod,omitempty"`
	Blackout     string `json:"blackout,omitempty"`
	Expiry       string `json:"expiry,omitempty"`
	// ErrorPenalty is the weighted round robin error penalty (default 1).
	ErrorPenalty *float64 `json:"errorPenalty,omitempty"`
	// ErrorWeight is how many active requests a recent error counts as
	// under least_loaded (default 1; 0 turns the protection against
	// sinkholing off).
	ErrorWeight *int `json:"errorWeight,omitempty"`
	// EjectAfter is how many calls in a row must end at their deadlines
	// with nothing received from a backend before it is ejected (default
	// 5; 0 disables ejection), and Ejection how long its first ejection
	// lasts ("1s" by default; doubled for each in a row, at most 30s).
	EjectAfter *int   `json:"ejectAfter,omitempty"`
	Ejection   string `json:"ejection,omitempty"`
	// StallPicks and StallAfter eject a backend before its calls'
	// deadlines: picked StallPicks times since its last answer (default
	// 4; 0 disables it), then nothing from it for StallAfter ("250ms" by
	// default, at most 30s) while other backends answer.
	StallPicks *int   `json:"stallPicks,omitempty"`
	StallAfter string `json:"stallAfter,omitempty"`
	// OOBLoadReport subscribes to each backend's out-of-band load reports
	// (ORCA's OpenRcaService: triagegrpc.RegisterLoadReportService), so
	// that weighted round robin has every backend's load from its first
	// pick, before any call of its own; Blackout then defaults to 0 (the
	// reports describe the backends' load from their other clients).
	// OOBReportPeriod is the interval asked for ("10s" by default, at most
	// 1h; servers on grpc-go's orca package send at most every 30 s).
	OOBLoadReport   bool   `json:"oobLoadReport,omitempty"`
	OOBReportPeriod string `json:"oobReportPeriod,omitempty"`

	opts         []balance.Option
	alg          subset.Algorithm
	replaceAfter time.Duration
	oobPeriod    time.Duration
}

// DefaultOOBReportPeriod is the out-of-band report interval a balancer
// asks for: grpc-go's weighted_round_robin's.
const DefaultOOBReportPeriod = 10 * time.Second

// countAndDuration reads a pair of settings (a count of calls, 0 to
// 65536, and a duration in (0, MaxEjection] unless the count is 0),
// either of them defaulted.
func countAndDuration(nName string, n *int, defN int, dName, d string, defD time.Duration) (int, time.Duration, error) {
	cn, cd := defN, defD
	if n != nil {
		cn = *n
	}
	if d != "" {
		var err error
		if cd, err = time.ParseDuration(d); err != nil {
			return 0, 0, fmt.Errorf("%s %q is not a duration", dName, d)
		}
	}
	if cn < 0 || cn > 1<<16 || cn > 0 && (cd <= 0 || cd > balance.MaxEjection) {
		return 0, 0, fmt.Errorf("%s %d, %s %v (want 0 to 65536 calls, and a duration in (0, %v])", nName, cn, dName, cd, balance.MaxEjection)
	}
	return cn, cd, nil
}

// Register registers the "triage" load balancer with grpc-go, so
// that a service config can select it. grpc-go's registry is global: call
// it once, from main, before dialing (a second call replaces the first).
// Triage registers nothing by itself.
func Register(opts ...Option) {
	var b balancerBuilder
	for _, o := range opts {
		o.apply(&b)
	}
	balancer.Register(b)
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

// ParseConfig parses and validates a "triage" balancer
// configuration.
func ParseConfig(js []byte) (*Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("triage balancer: %w", err)
	}
	for _, step := range []func() error{c.balanceOptions, c.failureOptions, c.subsetOptions} {
		if err := step(); err != nil {
			return nil, fmt.Errorf("triage balancer: %w", err)
		}
	}
	if _, err := balance.New(c.opts...); err != nil { // validates the values
		return nil, fmt.Errorf("triage balancer: %w", err)
	}
	return &c, nil
}

// balanceOptions reads the policy, the cap on active requests and the
// durations of the load picture.
func (c *Config) balanceOptions() error {
	if c.Policy == "" {
		c.Policy = balance.RoundRobin.String()
	}
	p, err := balance.ParsePolicy(c.Policy)
	if err != nil {
		return err
	}
	c.opts = append(c.opts, balance.WithPolicy(p))
	switch {
	case c.MaxActive < -1:
		return fmt.Errorf("maxActive %d (want -1 to disable, or a positive cap)", c.MaxActive)
	case c.MaxActive == -1:
		c.opts = append(c.opts, balance.WithMaxActive(0))
	case c.MaxActive > 0:
		c.opts = append(c.opts, balance.WithMaxActive(c.MaxActive))
	}
	for _, d := range []struct {
		name, v string
		opt     func(time.Duration) balance.Option
	}{{"errorWindow", c.ErrorWindow, balance.WithErrorWindow}, {"weightPeriod", c.WeightPeriod, balance.WithWeightPeriod}, {"blackout", c.Blackout, balance.WithBlackout}, {"expiry", c.Expiry, balance.WithExpiry}} {
		if d.v == "" {
			continue
		}
		v, err := time.ParseDuration(d.v)
		if err != nil || v < 0 || (v == 0 && d.name != "blackout") {
			return fmt.Errorf("%s %q is not a positive duration", d.name, d.v)
		}
		c.opts = append(c.opts, d.opt(v))
	}
	c.oobPeriod = DefaultOOBReportPeriod
	if c.OOBReportPeriod != "" {
		d, err := time.ParseDuration(c.OOBReportPeriod)
		if err != nil || d <= 0 || d > time.Hour {
			return fmt.Errorf("oobReportPeriod %q is not a duration in (0, 1h]", c.OOBReportPeriod)
		}
		c.oobPeriod = d
	}
	if c.OOBLoadReport && c.Blackout == "" {
		c.opts = append(c.opts, balance.WithBlackout(0))
	}
	return nil
}

// failureOptions reads how errors weigh, and when a backend is ejected
// or counted as stalled.
func (c *Config) failureOptions() error {
	if c.ErrorPenalty != nil {
		c.opts = append(c.opts, balance.WithErrorPenalty(*c.ErrorPenalty))
	}
	if c.ErrorWeight != nil {
		c.opts = append(c.opts, balance.WithErrorWeight(*c.ErrorWeight))
	}
	if c.EjectAfter != nil || c.Ejection != "" {
		n, d, err := countAndDuration("ejectAfter", c.EjectAfter, balance.DefaultEjectAfter, "ejection", c.Ejection, balance.DefaultEjection)
		if err != nil {
			return err
		}
		c.opts = append(c.opts, balance.WithEjection(n, d))
	}
	if c.StallPicks != nil || c.StallAfter != "" {
		n, d, err := countAndDuration("stallPicks", c.StallPicks, balance.DefaultStallPicks, "stallAfter", c.StallAfter, balance.DefaultStallAfter)
		if err != nil {
			return err
		}
		c.opts = append(c.opts, balance.WithStall(n, d))
	}
	return nil
}

// subsetOptions reads the subset's size, algorithm, client id and
// replacement delay.
func (c *Config) subsetOptions() error {
	if c.SubsetSize < -1 {
		return fmt.Errorf("subsetSize %d (want -1 for every backend, or a positive size)", c.SubsetSize)
	}
	c.replaceAfter = subset.DefaultReplaceAfter
	if c.ReplaceAfter != "" {
		d, err := time.ParseDuration(c.ReplaceAfter)
		if err != nil || d <= 0 || d > time.Minute {
			return fmt.Errorf("replaceAfter %q is not a duration in (0, 1m]", c.ReplaceAfter)
		}
		c.replaceAfter = d
	}
	if c.SubsetAlgorithm == "" {
		c.SubsetAlgorithm = "deterministic"
	}
	var err error
	if c.alg, err = subset.ByName(c.SubsetAlgorithm, 0); err != nil {
		return err
	}
	if c.ClientID != nil && *c.ClientID < 0 {
		return fmt.Errorf("clientId %d (want >= 0)", *c.ClientID)
	}
	return nil
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

func sameConfig(a, b *Config) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
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

type picker struct {
	b         *triageBalancer
	core, sac *balance.Balancer
}

// errFlowControl is the answer when every backend has the client's
// MaxActive requests: task overloaded (UNAVAILABLE), the client's own
// judgement that the backends are full, so that its throttle counts it as
// a rejection and its retry policy treats it as an overload.
var errFlowControl = triagegrpc.Status(&outcome.Error{Kind: outcome.TaskOverloaded, Reason: "every backend in the subset is at the client's flow-control cap"}).Err()

var (
	errBlackHole    = triagegrpc.Status(intake.ErrBlackHoled).Err()
	errNoSacrifical = status.Error(codes.Unavailable, "triage: no backend on this client type's route")
)

func (p *picker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	core := p.core
	if iso := p.b.iso; iso != nil {
		p.b.repartition()
		switch iso.RouteOf(isolate.ClientOf(info.Ctx)) {
		case isolate.BlackHole:
			return balancer.PickResult{}, errBlackHole
		case isolate.Sacrificial:
			core = p.sac
		}
		if len(core.Endpoints()) == 0 {
			return balancer.PickResult{}, errNoSacrifical
		}
	}
	// An endpoint's own picker can fail for a moment before its new state
	// reaches this picker (a backend entering lame duck turns its health
	// check NOT_SERVING): try up to two other endpoints before failing
	// the call.
	var (
		r   balancer.PickResult
		d   *endpointData
		err error
	)
	pick := core.Pick
	if criticality.Of(info.Ctx) >= criticality.Critical {
		pick = core.PickCritical // not spent as a probe of an ejected backend
	}
	for try := 0; try < 3; try++ {
		e, perr := pick()
		if errors.Is(perr, balance.ErrFlowControl) {
			// Every healthy backend has MaxActive of this client's
			// requests: fail at once rather than leave the call blocked in
			// the client until its deadline (the book's warning about this
			// limit).
			return balancer.PickResult{}, errFlowControl
		}
		if perr != nil {
			// No backend is ready (lame duck ones are picked when no
			// other is): the call waits for a new picker (grpc-go blocks
			// on ErrNoSubConnAvailable until the state changes or the
			// deadline).
			return balancer.PickResult{}, balancer.ErrNoSubConnAvailable
		}
		d, _ = e.Value().(*endpointData)
		if d == nil || d.picker == nil {
			e.Release()
			return balancer.PickResult{}, balancer.ErrNoSubConnAvailable
		}
		if r, err = d.picker.Pick(info); err == nil {
			break
		}
		e.Release()
	}
	if err != nil {
		return r, err
	}
	done := d.done
	if deadline, ok := info.Ctx.Deadline(); ok {
		e, lame, picked := d.e, d.lame, time.Now()
		done = func(di balancer.DoneInfo) { finish(e, di, unanswered(di, picked, deadline), lame) }
	}
	if inner := r.Done; inner != nil {
		r.Done = func(di balancer.DoneInfo) { done(di); inner(di) }
	} else {
		r.Done = done
	}
	return r, nil
}

// unanswered says a call ended with nothing of use from the backend after
// waiting at least nine tenths of its time: nothing received at its
// deadline, or cancelled just before it by a caller upstream whose
// deadline came first (each hop's deadline is a little later than its
// caller's), or the backend's own DEADLINE_EXCEEDED then (a backend whose
// dependencies hang answers so).
func unanswered(di balancer.DoneInfo, picked, deadline time.Time) bool {
	switch c := status.Code(di.Err); {
	case c == codes.DeadlineExceeded:
	case c == codes.Canceled && !di.BytesReceived:
	default:
		return false
	}
	budget := deadline.Sub(picked)
	return budget > 0 && time.Since(picked) >= budget-budget/10
}

// doneFunc is an endpoint's completion: it ends the active request,
// counts backend errors, takes the load report and the lame duck
// announcement from the trailer.
func doneFunc(e *balance.Endpoint, lame func()) func(balancer.DoneInfo) {
	return func(di balancer.DoneInfo) { finish(e, di, false, lame) }
}

// finish ends a call on e: unanswered, or answered and counted against
// the backend if its error says so; then the trailer's load report and
// lame duck announcement (lame is called when it is new).
func finish(e *balance.Endpoint, di balancer.DoneInfo, unanswered bool, lame func()) {
	switch c := status.Code(di.Err); {
	case unanswered:
		e.DoneUnanswered()
	case !di.BytesReceived && (c == codes.Canceled || c == codes.DeadlineExceeded):
		e.Release() // given up early: no answer, and no evidence of none
	case (c == codes.Unavailable || c == codes.ResourceExhausted) && refusedOnItsOwn(di.Err):
		e.Refused() // the codes triage's refusals carry: nothing else is decoded
	default:
		e.Done(backenderr.Failed(di.Err))
	}
	if l, ok := di.ServerLoad.(*v3orcapb.OrcaLoadReport); ok && l != nil {
		e.Report(loadOf(l))
	}
	if v := di.Trailer.Get(wire.LameDuckKey); len(v) > 0 && v[0] == "1" {
		was := e.State()
		e.SetState(balance.LameDuck)
		if was != balance.LameDuck {
			lame()
		}
	}
}

// refusedOnItsOwn says err is a triage refusal the backend made on its
// own account (it was overloaded, or the caller out of quota), not one
// relayed from its dependencies: an answer from a live backend.
func refusedOnItsOwn(err error) bool {
	if err == nil {
		return false
	}
	oe, ok := triagegrpc.FromStatus(status.Convert(err))
	return ok && !oe.Relayed()
}

// loadOf reads an ORCA load report: the application utilization, else the
// CPU's, and the span of triage's backends (wire.ReportSpanMetric; 0 when
// absent or not a number of seconds up to a day).
func loadOf(l *v3orcapb.OrcaLoadReport) balance.Load {
	u := l.GetApplicationUtilization()
	if u <= 0 {
		u = l.GetCpuUtilization()
	}
	var span time.Duration
	if s := l.GetNamedMetrics()[wire.ReportSpanMetric]; s > 0 && s <= 86400 {
		span = time.Duration(s * float64(time.Second))
	}
	return balance.Load{QPS: l.GetRpsFractional(), EPS: l.GetEps(), Utilization: u, Span: span}
}

// NewSubConn is the children's, through endpointsharding; with
// OOBLoadReport, each SubConn that becomes ready subscribes to its
// backend's out-of-band load reports until it is no longer ready.
func (b *triageBalancer) NewSubConn(addrs []resolver.Address, opts balancer.NewSubConnOptions) (balancer.SubConn, error) {
	b.mu.Lock()
	on := b.cfg != nil && b.cfg.OOBLoadReport
	var period time.Duration
	if on {
		period = b.cfg.oobPeriod
	}
	b.mu.Unlock()
	if !on || len(addrs) == 0 {
		return b.ClientConn.NewSubConn(addrs, opts)
	}
	id := addrs[0].Addr
	var sc balancer.SubConn
	inner := opts.StateListener
	opts.StateListener = func(st balancer.SubConnState) {
		b.oobState(sc, id, st.ConnectivityState, period)
		if inner != nil {
			inner(st)
		}
	}
	sc, err := b.ClientConn.NewSubConn(addrs, opts)
	return sc, err
}

// oobState starts or stops a SubConn's out-of-band listener as it becomes
// ready or stops being ready. grpc-go calls it serially per SubConn.
func (b *triageBalancer) oobState(sc balancer.SubConn, id string, st connectivity.State, period time.Duration) {
	b.mu.Lock()
	stop, listening := b.oob[sc]
	if st != connectivity.Ready && listening {
		delete(b.oob, sc)
	}
	closed := b.isClosed()
	b.mu.Unlock()
	switch {
	case st == connectivity.Ready && !listening && !closed:
		stop := orca.RegisterOOBListener(sc, oobListener{b: b, id: id}, orca.OOBListenerOptions{ReportInterval: period})
		b.mu.Lock()
		b.oob[sc] = stop
		b.mu.Unlock()
	case st != connectivity.Ready && listening:
		stop()
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

// oobListener takes one backend's out-of-band reports to its endpoint, or
// keeps the latest until the endpoint exists.
type oobListener struct {
	b  *triageBalancer
	id string
}

func (l oobListener) OnLoadReport(r *v3orcapb.OrcaLoadReport) {
	load := loadOf(r)
	l.b.mu.Lock()
	e := l.b.endpoints[l.id]
	if e == nil {
		if _, member := l.b.byID[l.id]; member {
			l.b.oobPending[l.id] = load
		}
	}
	l.b.mu.Unlock()
	if e != nil {
		e.Report(load)
	}
}
