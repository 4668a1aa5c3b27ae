package balance

import (
	"math"
	"sync"
	"sync/atomic"
)

// The layout of an endpoint's packed word (Endpoint.w).
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
	// othersSeen is from when e's silence counts (another served since
	// suspect; 0 before), checked the last look at a suspect.
	othersSeen atomic.Int64
	checked    atomic.Int64
	id         string
	b          *Balancer
	value      atomic.Value

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
	e.clearSuspect()
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
