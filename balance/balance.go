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
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
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

// ClockOption sets the clock of a Balancer or a Meter (WithClock).
type ClockOption struct{ c clock.Clock }

// WithClock sets the clock of a Balancer or a Meter. Default clock.Real().
func WithClock(c clock.Clock) ClockOption { return ClockOption{c} }

func (o ClockOption) apply(cfg *config)           { cfg.clock = o.c }
func (o ClockOption) applyMeter(cfg *meterConfig) { cfg.clock = o.c }

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

// stalled reports whether e, picked stallPicks times since its last
// answer, has been suspect for stallAfter while others served, and
// ejects it if so. It is the slow path of a pick: it reads the clock and
// sums the other endpoints' service marks.
func (b *Balancer) stalled(e *Endpoint) bool {
	if e.State() != Healthy {
		return false
	}
	now := max(b.readClock(), 1)
	others := b.othersServed(e)
	since := e.suspect.Load()
	if since == 0 {
		if e.suspect.CompareAndSwap(0, now) {
			e.suspectOthers.Store(others)
		}
		return false
	}
	if now-since < int64(b.cfg.stallAfter) || others == e.suspectOthers.Load() {
		return false
	}
	e.eject()
	return true
}

// othersServed sums the service marks of e's fellow endpoints: it grows
// when one of them answers, with no failure, a request picked since its
// last such answer.
func (b *Balancer) othersServed(e *Endpoint) uint64 {
	var sum uint64
	for _, x := range b.set.Load().eps {
		if x != e {
			sum += x.served.Load()
		}
	}
	return sum
}

// pick is Pick without counting the request.
func (b *Balancer) pick() (*Endpoint, error) {
	s := b.set.Load()
	n := len(s.eps)
	if n == 0 {
		return nil, ErrNoEndpoint
	}
	// Every pick advances the round robin position by one, or more when it
	// skips ineligible endpoints: that one shared add also paces the clock
	// reads, about one pick in 64.
	next := b.rr.Add(1)
	if next&63 == 0 {
		s = b.tick(s)
	}
	var e *Endpoint
	crossed := false // skips moved the position past a multiple of 64
	switch b.cfg.policy {
	case LeastLoaded:
		e = b.leastLoaded(s, next)
	case WeightedRoundRobin:
		if len(s.sched) > 0 {
			if c := s.eps[s.sched[next%uint64(len(s.sched))]]; c.eligible(b.cfg.maxActive) {
				e = c
				break
			}
		}
		e, crossed = b.roundRobin(s.eps, next)
	default:
		e, crossed = b.roundRobin(s.eps, next)
	}
	if crossed {
		s = b.tick(s)
	}
	if e == nil {
		for _, x := range s.eps {
			if x.w.Load()&notHealthy == 0 {
				return nil, ErrFlowControl
			}
		}
		if e = b.lameDuckPick(s.eps, next); e == nil {
			return nil, ErrNoEndpoint
		}
	}
	return e, nil
}

// lameDuckPick is the pick when no endpoint is healthy: lame duck tasks
// still serve, so a request goes to one of them (round robin from start,
// under the flow-control cap) rather than fail. It first lets expired
// announcements go.
func (b *Balancer) lameDuckPick(eps []*Endpoint, start uint64) *Endpoint {
	if b.lameDucks.Load() == 0 {
		return nil
	}
	b.expireLameDucks(eps, b.readClock())
	n := uint64(len(eps))
	for i := range n {
		e := eps[(start+i)%n]
		if st := e.State(); st == LameDuck || st == Unresponsive || e.eligible(b.cfg.maxActive) {
			if b.cfg.maxActive == 0 || e.Active() < b.cfg.maxActive {
				return e
			}
		}
	}
	return nil
}

// expireLameDucks makes Healthy the endpoints whose lame duck
// announcement is older than DefaultLameDuckExpiry, or whose ejection is
// over, and recounts the others.
func (b *Balancer) expireLameDucks(eps []*Endpoint, now int64) {
	var left int64
	for _, e := range eps {
		switch e.State() {
		case LameDuck:
			if now-e.lameAt.Load() >= int64(DefaultLameDuckExpiry) {
				e.expire(LameDuck)
			} else {
				left++
			}
		case Unresponsive:
			if now >= e.ejectedUntil.Load() {
				e.expire(Unresponsive)
			} else {
				left++
			}
		}
	}
	b.lameDucks.Store(left)
}

// tick is the periodic work of picks, about one in 64: it reads the
// clock, lets expired lame duck announcements go, decays errors and
// recomputes weights when their period is over. It returns the endpoint
// set to pick from.
func (b *Balancer) tick(s *endpointSet) *endpointSet {
	now := b.readClock()
	if b.lameDucks.Load() > 0 {
		b.expireLameDucks(s.eps, now)
	}
	if epoch := now / int64(b.cfg.errorWindow); epoch > b.errEpoch.Load() {
		b.decayErrors(s.eps, epoch)
	}
	if b.cfg.policy == WeightedRoundRobin && now >= b.nextUpdate.Load() {
		b.updateWeights(now)
		return b.set.Load()
	}
	return s
}

// roundRobin returns the first eligible endpoint from position start,
// and moves the position past it, so that skipped endpoints do not hand
// their turns to the next eligible one. crossed says the move passed a
// multiple of 64, where the position would have called tick: skips must
// not starve the periodic work (with every other endpoint skipped, the
// position would only ever be odd).
func (b *Balancer) roundRobin(eps []*Endpoint, start uint64) (e *Endpoint, crossed bool) {
	n := uint64(len(eps))
	for i := range n {
		if e := eps[(start+i)%n]; e.eligible(b.cfg.maxActive) {
			if i > 0 {
				after := b.rr.Add(i)
				crossed = after>>6 != (after-i)>>6
			}
			return e, crossed
		}
	}
	return nil, false
}

// leastLoaded is round robin among the eligible endpoints with the fewest
// active requests plus weighted recent errors: one pass from a rotating
// start, keeping the first llCandidates endpoints with the least load. Of
// those, the one whose report shows the lowest utilization is picked (the
// first on a tie). Comparing a few, not all, is what keeps stale reports
// from herding: with many clients each sending little, active counts are
// mostly zero, and clients that all sent to the least utilized backend of
// their subset until its next report would overload it; here it gets at
// most llCandidates times its round robin share.
func (b *Balancer) leastLoaded(s *endpointSet, next uint64) *Endpoint {
	ws := s.ws
	n := len(ws)
	start := int(next % uint64(n))
	maxActive := uint64(b.cfg.maxActive)
	if maxActive == 0 {
		maxActive = math.MaxUint64
	}
	// Two passes, from start to the end and from 0 to start, so that the
	// loops need no wrap-around. The load is one shift of the endpoint's
	// word, with the not-healthy bit above it; an endpoint is skipped by
	// one comparison with limit: the best load so far, plus one while the
	// candidates are not complete.
	var idx [llCandidates]int
	var ww [llCandidates]uint64
	nc := 0
	best, limit := uint64(unhealthyLoad), uint64(unhealthyLoad)
	done := false
	for k, p := range ws[start:] {
		w := p.Load()
		if l := w >> loadShift; l < limit && w&activeMask < maxActive {
			if l < best {
				best, nc = l, 0
			}
			idx[nc], ww[nc] = start+k, w
			nc++
			if limit = best + 1; nc == llCandidates {
				if limit = best; best == 0 {
					done = true
					break
				}
			}
		}
	}
	if !done {
		for k, p := range ws[:start] {
			w := p.Load()
			if l := w >> loadShift; l < limit && w&activeMask < maxActive {
				if l < best {
					best, nc = l, 0
				}
				idx[nc], ww[nc] = k, w
				nc++
				if limit = best + 1; nc == llCandidates {
					if limit = best; best == 0 {
						break
					}
				}
			}
		}
	}
	if nc == 0 {
		return nil
	}
	pick, util := idx[0], ww[0]&utilMask
	for k := 1; k < nc; k++ {
		if u := ww[k] & utilMask; u < util {
			pick, util = idx[k], u
		}
	}
	if at := (pick - start + n) % n; at > 0 {
		b.rr.Add(uint64(at)) // the next pick starts after this one: round robin among the least loaded
	}
	return s.eps[pick]
}

// llCandidates is how many of the least loaded endpoints least-loaded
// compares by reported utilization: the most a backend reporting the
// lowest utilization can get is this many times its round robin share
// among the least loaded. Measured on the loopback spread test (two slow,
// two fast backends): 1.65 with 2, 1.49-1.50 with 3, 1.51 with all of
// them, against grpc-go least_request's 1.60-1.66. With all of them, the
// simulator (1000 clients, subsets of 20, each client sending little, so
// that active counts are mostly zero) showed stale reports herding
// clients onto a few backends and leaving others at 5% utilization; with
// 3 it wastes 14% of the CPU against round robin's 24% (triage sim lb).
const llCandidates = 3

const unhealthyLoad = notHealthy >> loadShift

// packed is an endpoint's hot word. Under least-loaded, the words of
// endpoints added together sit side by side, eight to a cache line: the
// scan of 100 endpoints reads 13 lines (a line each would make it three
// times dearer). Under the round robins each has its endpointLine.
type packed struct {
	atomic.Uint64
}

// endpointLine is an endpoint's hot word and pick count on a cache line of
// their own (round robin and weighted round robin): 128 bytes, so that
// whatever the slice's alignment, the 16 hot bytes of two endpoints are
// never within 64 bytes of each other.
type endpointLine struct {
	w        packed
	picks    atomic.Uint64
	answered atomic.Uint64
	served   atomic.Uint64
	_        [96]byte
}

// Endpoint is one backend of the subset.
type Endpoint struct {
	// w packs what a pick reads, so that a pick loads one word per
	// endpoint: active requests (bits 0-31); the least-loaded key (bits
	// 32-62): the reported utilization in eighths, 0 to 7 (bits 32-34),
	// under the load, active requests plus weighted recent errors (bits
	// 35-62); and a bit set while the endpoint is not Healthy (bit 63).
	// Under least-loaded it sits in a block shared with the endpoints
	// added with it; under the round robins, in an endpointLine.
	w        *packed
	state    atomic.Uint32
	errs     atomic.Uint32  // recent errors, halved every error window
	picks    *atomic.Uint64 // in its endpointLine, or ownPicks
	ownPicks atomic.Uint64
	// answered is the pick count at the endpoint's last answer (in its
	// endpointLine, or ownAnswered): picks less answered is how many
	// times it was picked since. suspect is when a pick found it stalled
	// (ns since the Balancer's start, 0: not suspect), suspectOthers the
	// other endpoints' service marks then. served is the pick count at
	// its last answer that was no failure (a success, or a refusal of its
	// own), in its endpointLine or ownServed: the proof that it serves,
	// which a failure (one relayed from a dependency the subset shares,
	// say) is not.
	answered      *atomic.Uint64
	ownAnswered   atomic.Uint64
	served        *atomic.Uint64
	ownServed     atomic.Uint64
	suspect       atomic.Int64
	suspectOthers atomic.Uint64
	id            string
	b             *Balancer
	value         atomic.Value

	mu          sync.Mutex // guards the report fields
	load        Load
	firstReport int64 // ns since the Balancer's start; 0: none
	lastReport  int64
	weight      atomic.Uint64 // float64 bits; 0: none
	lameAt      atomic.Int64  // when it was last put in LameDuck, ns since the Balancer's start
	// misses counts the requests in a row that ended unanswered;
	// ejections, the ejections in a row; ejectedUntil is when the last
	// one ends, ns since the Balancer's start.
	misses       atomic.Uint32
	ejections    atomic.Uint32
	ejectedUntil atomic.Int64
	// missOthers is othersServed at the first miss of the series: the
	// misses eject only once another endpoint served since (an outlier,
	// not an outage of the whole subset).
	missOthers atomic.Uint64
}

// SetValue attaches v to the endpoint, for the adapter (the gRPC adapter
// keeps the endpoint's current sub-picker there).
func (e *Endpoint) SetValue(v any) { e.value.Store(v) }

// Value returns what SetValue attached, or nil.
func (e *Endpoint) Value() any { return e.value.Load() }

// ID returns the endpoint's id.
func (e *Endpoint) ID() string { return e.id }

const (
	activeMask = 1<<32 - 1
	keyShift   = 32               // the least-loaded key: utilization, then load
	utilMask   = 7 << keyShift    // the reported utilization in eighths
	loadShift  = keyShift + 3     // active requests plus weighted errors
	oneActive  = 1<<loadShift | 1 // a request: one active, one in the load
	notHealthy = 1 << 63
	maxErrors  = 1 << 20 // recent errors saturate here

	// MaxErrorWeight bounds WithErrorWeight, so that saturated errors
	// (2^20 x 64) leave the load field (28 bits) room for active requests.
	MaxErrorWeight = 64
)

// State returns the endpoint's state.
func (e *Endpoint) State() State { return State(e.state.Load()) }

// Active returns the client's active requests to the endpoint.
func (e *Endpoint) Active() int64 { return int64(e.w.Load() & activeMask) }

// RecentErrors returns the endpoint's recent errors: each error counts 1,
// halved every error window.
func (e *Endpoint) RecentErrors() int64 { return int64(e.errs.Load()) }

// Picks returns how many times the endpoint was picked.
func (e *Endpoint) Picks() uint64 { return e.picks.Load() }

// Weight returns the endpoint's capability score (0 before a usable
// report).
func (e *Endpoint) Weight() float64 { return math.Float64frombits(e.weight.Load()) }

// SetState sets the endpoint's state: the adapter's view of the
// connection (Refusing, Healthy) and of lame duck announcements.
//
// LameDuck lasts DefaultLameDuckExpiry from the last SetState(LameDuck),
// then the endpoint is Healthy again (a task that still is in lame duck
// says so with its next answer).
func (e *Endpoint) SetState(s State) {
	if s == LameDuck {
		e.lameAt.Store(e.b.readClock())
		e.b.lameDucks.Add(1)
	}
	e.setState(s, Refusing)
}

// Connected tells the endpoint that its connection is up: it is Healthy
// unless it is in lame duck, which only the announcement's expiry ends.
// Unlike reading State and then calling SetState, it cannot undo an
// announcement that an answer brings meanwhile.
func (e *Endpoint) Connected() {
	e.setStateIf(Healthy, func(cur State) bool { return cur != LameDuck })
}

// expire makes an endpoint in state from Healthy, unless its state
// changed meanwhile.
func (e *Endpoint) expire(from State) { e.setState(Healthy, from) }

// setState sets the state; from, unless Refusing, is the state it must be
// in.
func (e *Endpoint) setState(s State, from State) {
	e.setStateIf(s, func(cur State) bool { return from == Refusing || cur == from })
}

// setStateIf sets the state if ok says so of the current one.
func (e *Endpoint) setStateIf(s State, ok func(State) bool) {
	e.b.update.Lock() // orders state changes with their bit
	if !ok(State(e.state.Load())) {
		e.b.unlockUpdate()
		return
	}
	old := State(e.state.Swap(uint32(s)))
	for {
		w := e.w.Load()
		next := w &^ notHealthy
		if s != Healthy {
			next |= notHealthy
		}
		if w == next || e.w.CompareAndSwap(w, next) {
			break
		}
	}
	e.b.unlockUpdate()
	if old != s {
		e.b.cfg.obs.StateChanged(e, old, s)
	}
}

func (e *Endpoint) eligible(maxActive int64) bool { return eligible(e.w.Load(), maxActive) }

func eligible(w uint64, maxActive int64) bool {
	return w&notHealthy == 0 && (maxActive == 0 || int64(w&activeMask) < maxActive)
}

// addError counts one error, saturating at maxErrors.
func (e *Endpoint) addError() {
	for {
		n := e.errs.Load()
		if n >= maxErrors {
			return
		}
		if e.errs.CompareAndSwap(n, n+1) {
			e.w.Add(uint64(e.b.cfg.errorWeight) << loadShift)
			return
		}
	}
}

// decayErrors halves every endpoint's recent errors once per error window
// that passed (all of them after 24), so that an error counts about one
// window and a half. Concurrent picks run on; it is called by the Pick that
// reads the clock into a new window.
func (b *Balancer) decayErrors(eps []*Endpoint, epoch int64) {
	last := b.errEpoch.Load()
	if epoch <= last || !b.errEpoch.CompareAndSwap(last, epoch) {
		return
	}
	shift := min(epoch-last, 24)
	for _, e := range eps {
		for {
			n := e.errs.Load()
			if n == 0 {
				break
			}
			if next := n >> shift; e.errs.CompareAndSwap(n, next) {
				e.w.Add(-(uint64(n-next) * uint64(b.cfg.errorWeight) << loadShift))
				break
			}
		}
	}
}

// Done ends a request picked on e that the backend answered. failed says
// the answer is an error that counts against the backend (not, say, the
// caller's cancellation). An answer ends an ejected endpoint's probation,
// unless it is an error: then the endpoint is ejected again for as long.
func (e *Endpoint) Done(failed bool) { e.done(failed, failed) }

// Refused ends a request picked on e that the backend refused on its own
// account: "task overloaded", its own "overloaded; don't retry", or the
// caller out of quota, not a failure relayed from its dependencies. It
// counts as an error, as Done(true) does, but it comes from a backend
// that answers: it ends an ejected endpoint's probation, as Done(false)
// does. After an outage every backend has a backlog to refuse; ejecting
// each again for its first refusal would send all the traffic to
// whichever answered first with a success.
func (e *Endpoint) Refused() { e.done(true, false) }

// done ends an answered request; failed counts it as an error, and
// unproven keeps an endpoint on probation (ejected again).
func (e *Endpoint) done(failed, unproven bool) {
	e.w.Add(^uint64(oneActive - 1)) // minus oneActive
	e.answered.Store(e.picks.Load())
	if !unproven {
		e.served.Store(e.picks.Load())
	}
	if e.suspect.Load() != 0 {
		e.suspect.Store(0)
	}
	if failed {
		e.addError()
	}
	if e.misses.Load() != 0 || e.ejections.Load() != 0 {
		e.misses.Store(0)
		if unproven && e.ejections.Load() != 0 && e.State() == Healthy {
			// On probation, an error is no proof of service (a backend
			// whose own dependencies are gone fails fast): ejected again,
			// for as long.
			e.ejectFor(e.ejections.Load())
			return
		}
		e.ejections.Store(0)
		if !unproven && e.State() == Unresponsive {
			// It serves again (a request it held through the ejection
			// was answered): the ejection predicted silence, and ends.
			e.expire(Unresponsive)
		}
	}
}

// Release ends a request picked on e that tells nothing of the backend:
// never sent, or given up by its caller before an answer. It counts
// neither as an answer nor as a miss.
func (e *Endpoint) Release() { e.w.Add(^uint64(oneActive - 1)) }

// DoneUnanswered ends a request picked on e that reached its deadline
// with no answer from the backend: an error, and a miss. After
// WithEjection's count of misses in a row, if another endpoint served
// (answered with no failure) since the first of them, the endpoint is
// Unresponsive for the ejection time (doubled for each ejection in a
// row); after it, one more miss ejects it again, on the same condition.
func (e *Endpoint) DoneUnanswered() {
	e.w.Add(^uint64(oneActive - 1))
	e.addError()
	n := e.b.cfg.ejectAfter
	if n == 0 {
		return
	}
	m := e.misses.Load()
	if m == 0 {
		e.missOthers.Store(e.b.othersServed(e))
	}
	if m < n {
		m = e.misses.Add(1)
	}
	if m < n || e.State() != Healthy || e.b.othersServed(e) == e.missOthers.Load() && len(e.b.set.Load().eps) > 1 {
		return
	}
	e.eject()
}

// eject makes a Healthy endpoint Unresponsive for the ejection time,
// doubled for each ejection in a row. Its picks so far no longer count
// as unanswered: after the ejection it gets requests again, and is
// ejected again by a miss or by a new stall.
func (e *Endpoint) eject() {
	k := e.ejections.Load()
	if k < 16 {
		k = e.ejections.Add(1)
	}
	e.ejectFor(k)
}

// ejectFor makes a Healthy endpoint Unresponsive for the ejection time of
// the k-th ejection in a row.
func (e *Endpoint) ejectFor(k uint32) {
	e.answered.Store(e.picks.Load())
	e.suspect.Store(0)
	k = min(k, 16) - 1
	d := min(e.b.cfg.ejection<<k, MaxEjection)
	e.ejectedUntil.Store(e.b.readClock() + int64(d))
	e.b.lameDucks.Add(1)
	e.setState(Unresponsive, Healthy)
}

// Report records a load report from the backend (from a response trailer
// or an out-of-band stream).
func (e *Endpoint) Report(l Load) {
	if !(l.QPS >= 0) || !(l.EPS >= 0) || !(l.Utilization >= 0) || math.IsInf(l.QPS+l.EPS+l.Utilization, 0) || l.Span < 0 {
		return // malformed: ignored
	}
	now := e.b.readClock()
	e.mu.Lock()
	e.load = l
	fresh := e.firstReport == 0 || now-e.lastReport > int64(e.b.cfg.expiry)
	if fresh {
		e.firstReport = max(now, 1)
	}
	e.lastReport = now
	e.mu.Unlock()
	e.setUtilization(l.Utilization)
	// A quiet client (fewer than 64 picks a period) still recomputes its
	// weights on time: reports read the clock anyway. Without a blackout,
	// an endpoint's first report counts at once (an out-of-band report
	// before the client's first call).
	if b := e.b; b.cfg.policy == WeightedRoundRobin && (now >= b.nextUpdate.Load() || fresh && l.Span >= b.cfg.blackout) {
		b.updateWeights(now)
	}
}

// setUtilization puts the reported utilization, in eighths (0 to 7; 1 and
// above is 7), in the least-loaded key, where it breaks ties between
// endpoints with equal load.
func (e *Endpoint) setUtilization(u float64) {
	bits := uint64(min(7, u*8)) << keyShift // u is finite and >= 0 (Report checks)
	for {
		w := e.w.Load()
		if w&utilMask == bits || e.w.CompareAndSwap(w, w&^utilMask|bits) {
			return
		}
	}
}

// Load returns the latest load report.
func (e *Endpoint) Load() Load {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.load
}

// score is A58's capability score of a report, 0 if unusable.
func (e *Endpoint) score(now int64, cfg *config) float64 {
	e.mu.Lock()
	l, first, last := e.load, e.firstReport, e.lastReport
	e.mu.Unlock()
	if first == 0 || now-last > int64(cfg.expiry) || now-first < int64(cfg.blackout) && l.Span < cfg.blackout {
		return 0
	}
	if l.QPS <= 0 || l.Utilization <= 0 {
		return 0
	}
	u := l.Utilization + cfg.errorPenalty*l.EPS/l.QPS
	return min(l.QPS/u, maxScore)
}

// maxScore bounds a capability score (queries per second per unit of
// utilization), so that a report of enormous rate at a vanishing
// utilization yields a finite weight, and sums of weights stay finite.
const maxScore = 1e12

// UpdateWeights recomputes the capability scores and the schedule now,
// without waiting for the period.
func (b *Balancer) UpdateWeights() { b.updateWeights(b.readClock()) }

// updateWeights recomputes the weights, or, when another goroutine holds
// b.update, leaves the recomputation to it: a report that arrives during
// another's recomputation is weighed when that one ends, not at the next
// report.
func (b *Balancer) updateWeights(now int64) {
	b.stale.Store(true)
	for b.stale.Load() && b.update.TryLock() {
		b.stale.Store(false)
		b.nextUpdate.Store(now + int64(b.cfg.period))
		s := b.set.Load()
		b.set.Store(&endpointSet{eps: s.eps, ws: s.ws, sched: b.schedule(s.eps, now)})
		b.cfg.obs.WeightsUpdated(b)
		b.update.Unlock()
		now = b.readClock()
	}
}

// unlockUpdate releases b.update and does the recomputation asked for
// while it was held.
func (b *Balancer) unlockUpdate() {
	b.update.Unlock()
	if b.stale.Load() {
		b.updateWeights(b.readClock())
	}
}

// schedule computes the weights and returns the WeightedRoundRobin
// schedule: endpoint indices, each endpoint about weight/min-weight times,
// interleaved by smooth weighted round robin. Endpoints without a usable
// score get the mean of the others (A58). Nil when no endpoint has a
// score: round robin applies.
func (b *Balancer) schedule(eps []*Endpoint, now int64) []uint16 {
	if b.cfg.policy != WeightedRoundRobin || len(eps) == 0 {
		return nil
	}
	w := make([]float64, len(eps))
	var sum float64
	scored := 0
	for i, e := range eps {
		w[i] = e.score(now, &b.cfg)
		e.weight.Store(math.Float64bits(w[i]))
		if w[i] > 0 {
			sum += w[i]
			scored++
		}
	}
	if scored == 0 {
		return nil
	}
	mean := sum / float64(scored)
	lo := math.Inf(1)
	for i := range w {
		if w[i] == 0 {
			w[i] = mean
		}
		lo = min(lo, w[i])
	}
	// Slots per endpoint: weight / lowest weight, scaled so that the
	// lightest gets 8 slots (precision of 1/8) or fewer if the schedule
	// would exceed maxSlots.
	scale := 8 / lo
	var total float64
	for _, x := range w {
		total += x * scale
	}
	if total > maxSlots {
		scale *= maxSlots / total
	}
	slots := make([]int, len(w))
	n := 0
	for i, x := range w {
		slots[i] = max(1, int(math.Round(x*scale)))
		n += slots[i]
	}
	// Interleave: endpoint i's k slots sit at (j + phase_i) / k for j < k,
	// with phases spread by the golden ratio so that endpoints of equal
	// weight alternate; the schedule is the slots sorted by position.
	type slot struct {
		pos float64
		i   uint16
	}
	all := make([]slot, 0, n)
	for i, k := range slots {
		phase := math.Mod(float64(i)*0.6180339887498949, 1)
		for j := range k {
			all = append(all, slot{(float64(j) + phase) / float64(k), uint16(i)})
		}
	}
	slices.SortFunc(all, func(x, y slot) int { return cmp.Compare(x.pos, y.pos) })
	sched := make([]uint16, len(all))
	for k, x := range all {
		sched[k] = x.i
	}
	return sched
}
