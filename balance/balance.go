// Package balance picks which backend of a client's subset receives each
// request: SRE book ch. 20, "Identifying Bad Tasks: Flow Control and Lame
// Ducks" and "Load Balancing Policies".
//
// A Balancer holds the Endpoints of one subset (SetEndpoints). Pick
// returns an eligible Endpoint, Healthy and below the flow-control cap
// (WithMaxActive, default 100), by RoundRobin, LeastLoaded (fewest active
// requests, recent errors counted as active, load reports breaking ties)
// or WeightedRoundRobin (gRPC's A58 score from load reports), and picks a
// lame duck one only when none is eligible. The adapter reports each
// request's end (Done, DoneUnanswered), the backend's load (Report) and
// its state (Connected, SetState); a backend that stops answering while
// its connection stays up is ejected for a while (WithEjection,
// WithStall), then serves on probation until it answers.
//
// Create one with New; the zero value is not usable. It is safe for
// concurrent use; Pick and Done take no lock and do not allocate. It is
// bounded by its Endpoints: nothing grows with traffic. How it picks, and
// why: docs/balance.md.
package balance

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/clock"
)

// ErrNoEndpoint is returned by Pick when no endpoint is healthy or in
// lame duck.
var ErrNoEndpoint = errors.New("balance: no healthy backend")

// ErrFlowControl is returned by Pick when healthy endpoints exist but every
// one is at the flow-control cap.
var ErrFlowControl = errors.New("balance: every healthy backend is at the flow-control cap")

// Policy is a load balancing policy.
type Policy uint8

const (
	// RoundRobin cycles over the eligible backends.
	RoundRobin Policy = iota
	// LeastLoaded is round robin among the eligible backends with the
	// fewest active requests plus recent errors.
	LeastLoaded
	// WeightedRoundRobin is round robin weighted by capability scores from
	// the backends' load reports.
	WeightedRoundRobin
)

// String returns the policy's name.
func (p Policy) String() string {
	switch p {
	case RoundRobin:
		return "round_robin"
	case LeastLoaded:
		return "least_loaded"
	case WeightedRoundRobin:
		return "weighted_round_robin"
	}
	return fmt.Sprintf("Policy(%d)", uint8(p))
}

// ParsePolicy parses a policy name as String writes it.
func ParsePolicy(s string) (Policy, error) {
	for p := RoundRobin; p <= WeightedRoundRobin; p++ {
		if p.String() == s {
			return p, nil
		}
	}
	return 0, fmt.Errorf("balance: unknown policy %q (want round_robin, least_loaded or weighted_round_robin)", s)
}

// State is a backend's state as the client sees it.
type State uint32

const (
	// Refusing is a backend the client cannot reach: starting, shutting
	// down, or broken. It is the state of a new Endpoint.
	Refusing State = iota
	// Healthy is a backend processing requests.
	Healthy
	// LameDuck is a backend that still serves but asks clients to stop
	// sending it requests.
	LameDuck
	// Unresponsive is a backend ejected for not answering: the client's
	// last requests to it all ended at their deadlines without an answer
	// (a hung process holds its connections open, so they look healthy).
	// Like LameDuck, it is picked only when no backend is Healthy.
	Unresponsive
)

// String returns the state's name.
func (s State) String() string {
	switch s {
	case Refusing:
		return "refusing"
	case Healthy:
		return "healthy"
	case LameDuck:
		return "lame_duck"
	case Unresponsive:
		return "unresponsive"
	}
	return fmt.Sprintf("State(%d)", uint32(s))
}

// Load is a backend's load report: the backend's own view of all its
// clients' traffic.
type Load struct {
	// QPS is successful queries per second, EPS errors per second.
	QPS, EPS float64
	// Utilization is the backend's utilization (CPU or application
	// utilization), 0 to 1 or a little more.
	Utilization float64
	// Span is how long the backend measured the rates over (0: not
	// said). A report measured over at least the blackout counts at
	// once: the blackout is for a backend's first seconds, not a
	// client's.
	Span time.Duration
}

// Observer receives the Balancer's events, for metrics. Implementations
// must be safe for concurrent use and cheap.
type Observer interface {
	Picked(e *Endpoint)
	StateChanged(e *Endpoint, from, to State)
	WeightsUpdated(b *Balancer)
}

// Nop is an Observer that does nothing.
type Nop struct{}

func (Nop) Picked(*Endpoint)                     {}
func (Nop) StateChanged(*Endpoint, State, State) {}
func (Nop) WeightsUpdated(*Balancer)             {}

// Option configures a Balancer.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	policy       Policy
	maxActive    int64
	errorWindow  time.Duration
	errorWeight  int64
	period       time.Duration
	blackout     time.Duration
	expiry       time.Duration
	errorPenalty float64
	ejectAfter   uint32
	ejection     time.Duration
	stallPicks   uint64
	stallAfter   time.Duration
	clock        clock.Clock
	obs          Observer
}

// WithPolicy sets the policy. Default RoundRobin, the book's "most common
// approach". WeightedRoundRobin works as round robin until backends
// report load.
func WithPolicy(p Policy) Option { return optionFunc(func(c *config) { c.policy = p }) }

// DefaultLameDuckExpiry is how long a lame duck announcement keeps an
// endpoint out of the rotation unless announced again: a task that warmed
// up in lame duck and became ready gets traffic back after it, a task
// still in lame duck renews the mark with its next answer (one request per
// expiry per client, which it serves).
const DefaultLameDuckExpiry = 5 * time.Second

// WithMaxActive sets the flow-control cap: a backend with this many of the
// client's requests active is not picked. Default 100 (the book: "for most
// backends, 100 is a reasonable limit"). 0 disables the cap.
func WithMaxActive(n int) Option { return optionFunc(func(c *config) { c.maxActive = int64(n) }) }

// Defaults of WithEjection: five requests in a row unanswered (Envoy's
// consecutive failures before an outlier is ejected), ejected for 1 s,
// doubling with each ejection in a row up to MaxEjection.
const (
	DefaultEjectAfter = 5
	DefaultEjection   = time.Second
	MaxEjection       = 30 * time.Second
)

// WithEjection sets when a backend that does not answer is ejected: after
// n of the client's requests in a row ended at their deadlines without
// an answer (Endpoint.DoneUnanswered) while another backend of the
// subset served (a subset silent or failing as a whole ejects no one),
// for d, doubled with each ejection in a row (an ejected backend gets
// requests again after it, and one more unanswered ejects it again) up
// to MaxEjection; an answer ends the series, and an answer with no
// failure ends the ejection itself. n 0 disables ejection. Default DefaultEjectAfter and
// DefaultEjection.
func WithEjection(n int, d time.Duration) Option {
	return optionFunc(func(c *config) { c.ejectAfter, c.ejection = uint32(max(n, -1)), d })
}

// Defaults of WithStall: a backend picked four times since its last
// answer is suspect; one that then answers nothing for 250 ms while
// another backend of the subset answers is ejected.
const (
	DefaultStallPicks = 4
	DefaultStallAfter = 250 * time.Millisecond
)

// WithStall sets when a backend that stopped answering is ejected before
// its requests' deadlines: once it has been picked n times since its last
// answer, and then for d nothing came from it while another endpoint
// served, answering with no failure (so a subset that only holds long
// streams, where nobody answers, ejects no one, and neither does one
// whose other backends only fail, as they do when a dependency they
// share is gone). The ejection is WithEjection's, doubled with
// each in a row. After an ejection, until it answers, the backend is on
// probation: one request at a time, and ejected again when that one
// ends unanswered at its deadline or gets nothing back for d while
// others answer. n 0 disables it (and the probation). Default DefaultStallPicks and
// DefaultStallAfter.
func WithStall(n int, d time.Duration) Option {
	return optionFunc(func(c *config) { c.stallPicks, c.stallAfter = uint64(max(n, 0)), d })
}

// WithErrorWindow sets how long an error counts as an active request under
// LeastLoaded: recent errors are halved every window. Default 1 s.
func WithErrorWindow(d time.Duration) Option {
	return optionFunc(func(c *config) { c.errorWindow = d })
}

// WithErrorWeight sets how many active requests one recent error counts as
// under LeastLoaded, 0 to MaxErrorWeight. Default 1.
func WithErrorWeight(n int) Option { return optionFunc(func(c *config) { c.errorWeight = int64(n) }) }

// WithWeightPeriod sets how often WeightedRoundRobin recomputes the
// capability scores. Default 1 s (A58's weight_update_period).
func WithWeightPeriod(d time.Duration) Option { return optionFunc(func(c *config) { c.period = d }) }

// WithBlackout sets how long after a backend's first load report its score
// is ignored (the mean of the others applies), so that a freshly started
// task's noisy first reports do not swing traffic. Default 10 s (A58's
// blackout_period). 0 disables it. A report whose Load.Span is at least
// the blackout counts at once: the backend has measured that long.
func WithBlackout(d time.Duration) Option { return optionFunc(func(c *config) { c.blackout = d }) }

// WithExpiry sets after how long without a report a backend's score is
// forgotten. Default 3 min (A58's weight_expiration_period).
func WithExpiry(d time.Duration) Option { return optionFunc(func(c *config) { c.expiry = d }) }

// WithErrorPenalty sets the error penalty of the capability score: the
// utilization one error per query costs. Default 1 (A58's
// error_utilization_penalty).
func WithErrorPenalty(p float64) Option { return optionFunc(func(c *config) { c.errorPenalty = p }) }

// WithClock sets the Balancer's clock. Default clock.Real().
func WithClock(c clock.Clock) Option { return optionFunc(func(cfg *config) { cfg.clock = c }) }

// WithObserver sets the Observer. Default Nop.
func WithObserver(o Observer) Option { return optionFunc(func(c *config) { c.obs = o }) }

// Balancer picks endpoints of one subset. It is safe for concurrent use.
// Its memory is fixed by its endpoints and the schedule (at most
// maxSlots entries).
type Balancer struct {
	cfg   config
	start time.Time
	since func() time.Duration

	set      atomic.Pointer[endpointSet]
	rr       atomic.Uint64 // the round robin position; every pick advances it
	now      atomic.Int64  // ns since start, refreshed every 64 picks
	errEpoch atomic.Int64  // the error window of the last decay

	update     sync.Mutex  // held while recomputing weights or changing the set or a state
	stale      atomic.Bool // a recomputation was asked for while update was held
	nextUpdate atomic.Int64
	// lameDucks is at least the number of endpoints in LameDuck or
	// Unresponsive (exact after each expireLameDucks): while it is 0,
	// picks look for no expired announcement or ejection.
	lameDucks atomic.Int64
}

type endpointSet struct {
	eps   []*Endpoint
	ws    []*packed // eps[i].w
	sched []uint16  // WeightedRoundRobin: endpoint indices, interleaved by weight
}

// maxSlots bounds the WeightedRoundRobin schedule.
const maxSlots = 1 << 14

// New returns a Balancer without endpoints.
func New(opts ...Option) (*Balancer, error) {
	c := config{maxActive: 100, errorWindow: time.Second, errorWeight: 1, period: time.Second,
		blackout: 10 * time.Second, expiry: 3 * time.Minute, errorPenalty: 1, ejectAfter: DefaultEjectAfter, ejection: DefaultEjection,
		stallPicks: DefaultStallPicks, stallAfter: DefaultStallAfter}
	for _, o := range opts {
		o.apply(&c)
	}
	switch {
	case c.policy > WeightedRoundRobin:
		return nil, fmt.Errorf("balance: unknown policy %d", c.policy)
	case c.maxActive < 0:
		return nil, fmt.Errorf("balance: negative MaxActive %d", c.maxActive)
	case c.errorWindow <= 0, c.period <= 0, c.expiry <= 0:
		return nil, errors.New("balance: error window, weight period and expiry must be positive")
	case c.blackout < 0:
		return nil, errors.New("balance: negative blackout")
	case c.ejectAfter > 1<<16 || c.ejectAfter > 0 && (c.ejection <= 0 || c.ejection > MaxEjection):
		return nil, fmt.Errorf("balance: ejection after %d requests for %v: want 0 to 65536 requests, and a time in (0, %v]", int32(c.ejectAfter), c.ejection, MaxEjection)
	case c.stallPicks > 1<<16 || c.stallPicks > 0 && (c.stallAfter <= 0 || c.stallAfter > MaxEjection || c.ejection <= 0):
		return nil, fmt.Errorf("balance: stall after %d picks and %v: want 0 to 65536 picks, a time in (0, %v], and an ejection time", c.stallPicks, c.stallAfter, MaxEjection)
	case c.errorWeight < 0 || c.errorWeight > MaxErrorWeight:
		return nil, fmt.Errorf("balance: error weight %d out of range [0, %d]", c.errorWeight, MaxErrorWeight)
	case !(c.errorPenalty >= 0) || math.IsInf(c.errorPenalty, 0):
		return nil, fmt.Errorf("balance: error penalty %v out of range", c.errorPenalty)
	}
	c.clock = clock.OrReal(c.clock)
	if c.obs == nil {
		c.obs = Nop{}
	}
	b := &Balancer{cfg: c, start: c.clock.Now()}
	b.since = clock.SinceFunc(c.clock, b.start)
	b.set.Store(&endpointSet{})
	return b, nil
}

// Policy returns the Balancer's policy.
func (b *Balancer) Policy() Policy { return b.cfg.policy }

func (b *Balancer) readClock() int64 {
	n := int64(b.since())
	b.now.Store(n)
	return n
}

// SetEndpoints replaces the subset with one endpoint per id, keeping the
// state, counts and reports of ids already present. At most 65535.
func (b *Balancer) SetEndpoints(ids []string) ([]*Endpoint, error) {
	if len(ids) > math.MaxUint16 {
		return nil, fmt.Errorf("balance: %d endpoints, at most %d", len(ids), math.MaxUint16)
	}
	b.update.Lock()
	defer b.unlockUpdate()
	old := map[string]*Endpoint{}
	for _, e := range b.set.Load().eps {
		old[e.id] = e
	}
	eps := make([]*Endpoint, 0, len(ids))
	seen := make(map[string]bool, len(ids))
	fresh := 0
	for _, id := range ids {
		if seen[id] {
			return nil, fmt.Errorf("balance: endpoint %q twice", id)
		}
		seen[id] = true
		if old[id] == nil {
			fresh++
		}
	}
	// Under least-loaded, the new endpoints' words are allocated in one
	// block, so that the scan reads memory in a row. Under the round
	// robins, which touch one endpoint a pick, each endpoint's word and
	// pick count have a cache line of their own: concurrent picks land on
	// neighbouring endpoints, and words sharing a line would move it
	// between cores on every pick.
	var block []packed
	var lines []endpointLine
	if b.cfg.policy == LeastLoaded {
		block = make([]packed, fresh)
	} else {
		lines = make([]endpointLine, fresh)
	}
	for _, id := range ids {
		e := old[id]
		if e == nil {
			e = &Endpoint{id: id, b: b}
			if lines != nil {
				e.w, e.picks, e.answered, e.served = &lines[0].w, &lines[0].picks, &lines[0].answered, &lines[0].served
				lines = lines[1:]
			} else {
				e.w, e.picks, e.answered, e.served = &block[0], &e.ownPicks, &e.ownAnswered, &e.ownServed
				block = block[1:]
			}
			e.w.Store(notHealthy) // Refusing until the adapter says otherwise
		}
		eps = append(eps, e)
	}
	ws := make([]*packed, len(eps))
	for i, e := range eps {
		ws[i] = e.w
	}
	s := &endpointSet{eps: eps, ws: ws}
	s.sched = b.schedule(eps, b.readClock())
	b.set.Store(s)
	return eps, nil
}

// Endpoints returns the current endpoints.
func (b *Balancer) Endpoints() []*Endpoint { return b.set.Load().eps }

// Pick returns the endpoint for the next request and counts it active;
// call its Done when the request ends. When no endpoint is healthy it
// picks one in lame duck (they still serve); it returns ErrNoEndpoint
// when there is none of either, ErrFlowControl when every healthy one is
// at the cap.
func (b *Balancer) Pick() (*Endpoint, error) { return b.pickFor(false) }

// PickCritical is Pick for a request that must not be spent as a probe
// (CRITICAL and above): it does not go to an endpoint on probation
// (ejected, and no answer since) until that endpoint has waited
// DefaultProbeWait past its ejection for a Pick, unless every endpoint
// is on probation.
func (b *Balancer) PickCritical() (*Endpoint, error) { return b.pickFor(true) }

// DefaultProbeWait is how long after its ejection an endpoint on
// probation waits for a request from Pick before PickCritical probes it.
const DefaultProbeWait = time.Second

func (b *Balancer) pickFor(critical bool) (*Endpoint, error) {
	e, err := b.pick()
	if err != nil {
		return nil, err
	}
	if b.cfg.stallPicks > 0 && b.skip(e, critical) {
		// The policy chose an endpoint that may not take this request
		// (weighted round robin favours a backend that reports itself
		// idle, as one whose dependencies are gone does): the next
		// eligible one in round robin order that may, else e after all.
		s := b.set.Load()
		n := uint64(len(s.eps))
		start := b.rr.Load()
		for i := range n {
			if x := s.eps[(start+i)%n]; x != e && x.eligible(b.cfg.maxActive) && !b.skip(x, critical) {
				e = x
				break
			}
		}
	}
	e.w.Add(oneActive)
	e.picks.Add(1)
	b.cfg.obs.Picked(e)
	return e, nil
}

// skip reports whether e may not take a request now: it stalled (and is
// ejected now), or it is on probation (ejected, and no answer since) and
// takes one request at a time, not a critical one while it waits for
// another.
func (b *Balancer) skip(e *Endpoint, critical bool) bool {
	unanswered, probation := e.picks.Load()-e.answered.Load(), e.ejections.Load() > 0
	if (unanswered >= b.cfg.stallPicks || probation && unanswered > 0) && (b.stalled(e) || probation) {
		return true
	}
	return critical && probation && unanswered == 0 && b.readClock()-e.ejectedUntil.Load() < int64(DefaultProbeWait)
}
