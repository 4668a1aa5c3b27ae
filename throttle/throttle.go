// Package throttle implements client-side adaptive throttling, SRE book
// ch. 21, "Client-Side Throttling".
//
// Each client keeps, over a trailing window (the book: "the last two
// minutes"), the number of requests the application attempted and the number
// the backend accepted, separately per criticality ("The adaptive throttling
// system also keeps separate stats for each criticality"). A new request is
// rejected locally, without touching the network, with probability
//
//	max(0, (requests - K*accepts) / (requests + 1))
//
// With K = 2 the backend ends up rejecting about one request per request it
// accepts; lower K is more aggressive. Locally rejected requests still count
// as requests, so the rejection probability grows with the overload.
//
// Some choices go beyond the book's text, all to keep the promise that a
// client neither hurts a recovering backend nor starves a healthy one:
//
//   - A request is counted when its answer arrives (Done), or at once when it
//     is rejected locally, not when it is sent. Requests in flight cannot
//     have been accepted yet; counting them would make a burst of concurrent
//     first requests throttle itself before the first answer arrives.
//   - Besides the window (default the book's two minutes), the throttle
//     keeps a short window (default 3 s). The two-minute history alone keeps
//     rejecting for up to two minutes after the backend is healthy again
//     (TestRecoveryWithinSeconds measures about 110 s), and reaches the
//     book's equilibrium only slowly after an overload starts. So when the
//     short window holds at least ShortMin requests and its estimate differs
//     significantly from the whole window's (more than 3 standard errors
//     towards more rejection, 1.5 towards less, or no rejection due at all),
//     the short window decides: the client follows the backend within
//     seconds. In steady overload the two agree and the whole window's
//     steadier estimate decides, which keeps the equilibrium as exact as the
//     book's. WithShortWindow(0) gives the book's rule alone.
//   - When demand falls, the whole window's counts describe traffic that is
//     gone: after a surge of ten times the usual requests, its history
//     would keep rejecting the usual requests for up to two minutes,
//     although the backend accepted more than that per second all through
//     the surge. So the whole window's estimate is also computed with the
//     request rate of the last second (plus two standard errors) in place
//     of the whole window's, against the whole window's accept rate, and
//     the lower of the two is used: the client sends at most K times what
//     the backend accepted per second, whichever the demand. This needs no
//     minimum of recent requests, so a client whose rate fell below
//     ShortMin per short window recovers too.
//   - Nothing is rejected locally while the window holds fewer than
//     DefaultMinRequests (10) requests of the level: a client with almost
//     no history (a task just started) whose first answer is a rejection
//     would otherwise reject its own retry with probability 1/2. Past
//     that, the formula is the book's, so the equilibrium is unchanged.
//   - When the backend answered every request of the last second without
//     a rejection, the short window's rejections are history (an outage
//     of its own dependency that ended, say), not an overload starting,
//     and the whole window decides: alone, the short window would let the
//     client double what it sends only once per short window, about 10 s
//     from the 95% cap, while the backend accepts all of it. That the
//     backend answers again may be told by any level's requests: a level
//     throttled at the cap sends too few to tell it soon.
//   - Likewise when, in the last second, the backend refused at most K-1
//     of the level's requests per request it accepted (the book's rule
//     throttles none of them) and the level asks for no more than K times
//     what the backend accepted per second over the whole window: a
//     backend back from an outage that sheds part of its backlog. An
//     overload's onset asks for more than that, however hard the client
//     throttled itself.
//
// This package is the transport-free core; retry.Policy calls Allow before
// each attempt and Done with its answer, and the gRPC and HTTP adapters
// wrap retry.Policy.
package throttle

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/window"
)

// Defaults, from the book where it gives one.
const (
	// DefaultK is the book's K: "Typically, 2x". The backend then rejects
	// about one request per accepted request in steady overload.
	DefaultK = 2.0
	// DefaultWindow is the book's "last two minutes".
	DefaultWindow = 2 * time.Minute
	// DefaultBuckets is how many slices the window is cut into (0.5 s each
	// by default; buckets as long as a backend's own accounting period, e.g.
	// a per-second limit, make short-window decisions lock onto its phase). The oldest slice is weighted by how much of it is still
	// inside the window, so the count slides smoothly instead of dropping a
	// whole bucket at once.
	DefaultBuckets = 240
	// DefaultShortWindow is the short window used when it holds at least
	// DefaultShortMin requests.
	DefaultShortWindow = 3 * time.Second
	// DefaultMaxRejectProbability caps the local rejection probability, so
	// that a client always sends some requests and learns that the backend
	// recovered. Without it, a client whose recent requests were all
	// rejected rejects 99% locally and, sending one request in a hundred,
	// takes many seconds to notice the recovery (docs/rationale.md, "The
	// 95% cap"). At K = 2 the cap binds only beyond 40x overload; there the
	// backend's own admission control sheds the extra 5%.
	DefaultMaxRejectProbability = 0.95
	// DefaultShortMin is the number of requests the short window must hold
	// to be used instead of the whole window.
	DefaultShortMin = 10
	// DefaultMinRequests is how many requests of a level the window must
	// hold before any of them is rejected locally (WithMinRequests).
	DefaultMinRequests = 10
)

// MaxBuckets bounds the number of buckets, and so a Throttle's memory.
const MaxBuckets = 1024

// Throttle is an adaptive throttle for one client. Its memory is fixed at
// New: criticality.NumLevels x (buckets+1) 8-byte counters (each a pair of
// 32-bit counts) and a few more for the last second. It is safe
// for concurrent use; decisions take no lock (a lock is taken once per
// bucket width, by the first caller to see a new bucket).
//
// Call Allow before each request; when it returns true, call Done once with
// the answer. A Throttle keeps separate statistics per criticality.
type Throttle struct {
	k        float64
	minReq   float64
	maxP     float64
	shortMin float64
	useShort bool
	windowNS float64 // the whole window's span, ns
	shortNS  float64 // the short window's span, ns
	latest   int     // buckets in the last second (the demand cap's)
	start    time.Time
	startNS  int64        // start.UnixNano()
	firstNS  atomic.Int64 // the time of the first count, 0 before it
	since    func() time.Duration
	random   func() float64
	levels   [criticality.NumLevels]level
}

// level counts requests (A) and accepts (B) of one criticality, and in
// refused the backend's rejections (A) of the last second.
type level struct {
	window.Counter
	refused *window.Counter
}

// Option configures a Throttle.
type Option interface{ apply(*config) }

type config struct {
	k        float64
	minReq   int
	maxP     float64
	window   time.Duration
	buckets  int
	short    time.Duration
	shortMin int
	clock    clock.Clock
	random   func() float64
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithK sets K (in [1, 1e6]). Default DefaultK. Lower K rejects more
// locally: at 1.1 the backend rejects about one request per ten it accepts.
func WithK(k float64) Option { return optionFunc(func(c *config) { c.k = k }) }

// WithMinRequests sets how many requests of a level the window must hold
// before any of them is rejected locally (at least 0; 0 is the book's
// rule, which rejects a client's second request with probability 1/2
// when its first was rejected). Default DefaultMinRequests.
func WithMinRequests(n int) Option { return optionFunc(func(c *config) { c.minReq = n }) }

// WithMaxRejectProbability caps the probability of rejecting a request
// locally, in (0, 1]; 1 is the book's formula uncapped. Default
// DefaultMaxRejectProbability.
func WithMaxRejectProbability(p float64) Option {
	return optionFunc(func(c *config) { c.maxP = p })
}

// WithWindow sets the trailing window (at least 1 s). Default DefaultWindow.
func WithWindow(d time.Duration) Option { return optionFunc(func(c *config) { c.window = d }) }

// WithBuckets sets how many buckets the window is cut into
// (2..MaxBuckets). Default DefaultBuckets.
func WithBuckets(n int) Option { return optionFunc(func(c *config) { c.buckets = n }) }

// WithShortWindow sets the short window, rounded to whole buckets; it must
// be between one bucket and the window, or 0 to use the whole window always
// (the book's rule alone). Default DefaultShortWindow.
func WithShortWindow(d time.Duration) Option {
	return optionFunc(func(c *config) { c.short = d })
}

// WithShortMin sets how many requests the short window must hold to be
// used (at least 1). Default DefaultShortMin.
func WithShortMin(n int) Option { return optionFunc(func(c *config) { c.shortMin = n }) }

// WithClock sets the clock. Default clock.Real().
func WithClock(c clock.Clock) Option { return optionFunc(func(cfg *config) { cfg.clock = c }) }

// WithRandom sets the source of uniform numbers in [0, 1) used for the
// rejection draw; it must be safe for concurrent use if the Throttle is
// used concurrently. Default: math/rand/v2's lock-free global source. The
// simulator passes a seeded source.
func WithRandom(f func() float64) Option { return optionFunc(func(c *config) { c.random = f }) }

// ErrConfig is wrapped by every error New returns.
var ErrConfig = errors.New("throttle: invalid config")

// New returns a Throttle.
func New(opts ...Option) (*Throttle, error) {
	c := config{k: DefaultK, minReq: DefaultMinRequests, maxP: DefaultMaxRejectProbability, window: DefaultWindow, buckets: DefaultBuckets, short: DefaultShortWindow, shortMin: DefaultShortMin}
	for _, o := range opts {
		o.apply(&c)
	}
	switch {
	case !(c.k >= 1) || c.k > 1e6:
		return nil, fmt.Errorf("%w: K must be in [1, 1e6], got %v", ErrConfig, c.k)
	case c.minReq < 0:
		return nil, fmt.Errorf("%w: minimum requests must be at least 0, got %d", ErrConfig, c.minReq)
	case !(c.maxP > 0 && c.maxP <= 1):
		return nil, fmt.Errorf("%w: max reject probability must be in (0, 1], got %v", ErrConfig, c.maxP)
	case c.window < time.Second:
		return nil, fmt.Errorf("%w: window must be at least 1s, got %v", ErrConfig, c.window)
	case c.buckets < 2 || c.buckets > MaxBuckets:
		return nil, fmt.Errorf("%w: buckets must be in [2, %d], got %d", ErrConfig, MaxBuckets, c.buckets)
	case c.shortMin < 1:
		return nil, fmt.Errorf("%w: short-window minimum must be at least 1, got %d", ErrConfig, c.shortMin)
	}
	width := c.window / time.Duration(c.buckets)
	shortBuckets := 1
	if c.short != 0 {
		if c.short < width || c.short > c.window {
			return nil, fmt.Errorf("%w: short window must be 0 or in [%v, %v] (one bucket to the window), got %v", ErrConfig, width, c.window, c.short)
		}
		shortBuckets = int((c.short + width/2) / width)
	}
	clk := clock.OrReal(c.clock)
	t := &Throttle{
		k:        c.k,
		minReq:   float64(c.minReq),
		maxP:     c.maxP,
		shortMin: float64(c.shortMin),
		useShort: c.short != 0,
		windowNS: float64(width) * float64(c.buckets),
		shortNS:  float64(width) * float64(shortBuckets),
		latest:   max(1, int((time.Second+width/2)/width)),
		start:    clk.Now(),
		random:   c.random,
	}
	t.startNS = t.start.UnixNano()
	t.since = clock.SinceFunc(clk, t.start)
	if t.random == nil {
		t.random = rand.Float64
	}
	for i := range t.levels {
		t.levels[i].Counter = *window.New(int64(width), c.buckets, shortBuckets)
		t.levels[i].refused = window.New(int64(width), t.latest, 1)
	}
	return t, nil
}

func (t *Throttle) level(l criticality.Level) *level {
	if !l.Valid() {
		l = criticality.Default
	}
	return &t.levels[l]
}

// Times are nanoseconds since the Unix epoch: AllowAt and friends use the
// wall time they are given; Allow and friends use the wall time at New plus
// the monotonic time elapsed since, so a wall-clock step does not disturb
// the window.
func (t *Throttle) ns(now time.Time) int64 { return now.UnixNano() }

func (t *Throttle) nowNS() int64 { return t.startNS + int64(t.since()) }

// Allow decides whether to send a request of level l now. When the request
// must be rejected locally it returns false and counts the request as one
// that was not accepted. When it returns true, the caller sends the request
// and calls the Ticket's Done once with the answer.
//
// Allow reads the clock once (monotonic only, for the real clock); the
// Ticket carries that time, so Done does not read it again.
func (t *Throttle) Allow(l criticality.Level) (Ticket, bool) { return t.allow(l, t.nowNS()) }

// AllowAt is Allow at time now (for callers on virtual time).
func (t *Throttle) AllowAt(l criticality.Level, now time.Time) (Ticket, bool) {
	return t.allow(l, t.ns(now))
}

func (t *Throttle) allow(l criticality.Level, ns int64) (Ticket, bool) {
	if !l.Valid() {
		l = criticality.Default
	}
	lv := &t.levels[l]
	p := t.probability(lv, ns)
	if p <= 0 || t.random() >= p {
		return Ticket{t: t, ns: ns, l: l}, true
	}
	t.count(lv, ns, 0)
	return Ticket{}, false
}

// count adds a request to lv at ns, accepted or not.
func (t *Throttle) count(lv *level, ns int64, acc uint32) {
	if t.firstNS.Load() == 0 {
		t.firstNS.CompareAndSwap(0, ns)
	}
	lv.Add(ns, 1, acc)
}

// Ticket is a request Allow let through, waiting for its answer. It is a
// small value; copying it is free. The zero Ticket's Done does nothing.
type Ticket struct {
	t  *Throttle
	ns int64
	l  criticality.Level
}

// Done counts the request when its answer arrives: accepted is true for
// any answer that is not an overload or quota rejection. The request is
// counted in the bucket of the time Allow saw, which differs from the
// answer's by one round trip at most. A request abandoned by its caller
// before an answer may be left uncounted.
func (k Ticket) Done(accepted bool) {
	if k.t == nil {
		return
	}
	var acc uint32
	lv := &k.t.levels[k.l]
	if accepted {
		acc = 1
	} else {
		lv.refused.Add(k.ns, 1, 0)
	}
	k.t.count(lv, k.ns, acc)
}

// Record counts a request of level l at time now that was sent without
// asking Allow (the simulator and tests use it to seed history).
func (t *Throttle) Record(l criticality.Level, now time.Time, accepted bool) {
	if !l.Valid() {
		l = criticality.Default
	}
	Ticket{t: t, ns: t.ns(now), l: l}.Done(accepted)
}

// Thresholds for using the short window, in standard errors of its own
// estimate of the rejection probability (about K*sqrt(accepts)/requests).
// The short window decides when it differs from the whole window by more
// than that: by shortZ when it says the backend is more overloaded than the
// whole window says (onset), by recoverZ when it says less (recovery; lower,
// because staying throttled after the backend recovered costs more than a
// brief burst of extra requests). In steady overload the two agree and the
// whole window's steadier estimate decides.
const (
	shortZ   = 3.0
	recoverZ = 1.5
)

// decide returns the rejection probability of level lv at ns, with the
// counts it used and whether they are the short window's.
func (t *Throttle) decide(lv *level, ns int64) (p, req, acc float64, short bool) {
	w, sw := lv.Sums(ns)
	if w.A < t.minReq {
		return 0, w.A, w.B, false
	}
	book := rejectP(w.A, w.B, t.k)
	if !t.useShort {
		return book, w.A, w.B, false
	}
	pl := book
	fell := false
	if pl > 0 {
		rate := t.recentRate(lv, ns)
		pl = min(pl, rejectP(rate*t.span(ns), w.B, t.k))
		// Demand fell within the short window: its counts describe the
		// traffic that is gone, not a new overload.
		fell = 2*rate*t.shortNS < sw.A
	}
	if sw.A < t.shortMin || fell {
		return pl, w.A, w.B, false
	}
	ps := rejectP(sw.A, sw.B, t.k)
	if ps == 0 {
		// The recent requests were accepted as often as K allows: nothing
		// to throttle, whatever older history says.
		return 0, sw.A, sw.B, true
	}
	se := t.k * math.Sqrt(sw.B+1) / (sw.A + 1)
	// Onset is judged against the book's estimate: after demand fell, the
	// short window still holds the surge's local rejections for a while,
	// and they are not a new overload.
	if ps > book+shortZ*se && !t.acceptingAll(lv, ns) && !t.backAtDemand(lv, ns, w.B) || ps < pl-recoverZ*se {
		return ps, sw.A, sw.B, true
	}
	return pl, w.A, w.B, false
}

// acceptingAll reports whether the backend accepted every request of lv
// answered in the last second, and accepted some request of any level in
// it: then the short window's rejections are history (an outage that
// ended), not an onset, and the whole window decides. Any level's
// acceptance says that the backend answers again: a level throttled at
// the cap sends too few requests to say it soon (a level of 10 requests a
// second, one every 2 s), and its own refusals in the last second still
// say whether it is being shed.
func (t *Throttle) acceptingAll(lv *level, ns int64) bool {
	if refused, _ := lv.refused.Latest(ns, t.latest); refused > 0 {
		return false
	}
	for i := range t.levels {
		if p, _ := t.levels[i].LatestPair(ns, t.latest); p.B > 0 {
			return true
		}
	}
	return false
}

// backAtDemand reports whether the backend's answers to lv in the last
// second need no throttling by the book's rule (it refused at most K-1
// requests per request it accepted, and accepted at least backMin) while
// lv's demand in it is no more than K times the rate the backend accepted
// over the whole window (acc): then the short window's rejections are
// history, an outage that ended with the backend shedding part of its
// backlog, and the whole window decides. An overload's onset, however
// hard the client throttled itself, has demand above K times what the
// backend accepts; a backend that lost capacity refuses more than K-1
// per accepted request once throttling is due.
func (t *Throttle) backAtDemand(lv *level, ns int64, acc float64) bool {
	last, _ := lv.LatestPair(ns, t.latest)
	refused, _ := lv.refused.Latest(ns, t.latest)
	if last.B < backMin || refused > (t.k-1)*last.B {
		return false
	}
	return t.recentRate(lv, ns)*t.span(ns) <= t.k*acc
}

// backMin is how many requests of a level the backend must have accepted
// in the last second for backAtDemand to judge its answers.
const backMin = 2

// recentRate returns the requests per ns of the last second, plus two
// standard errors.
func (t *Throttle) recentRate(lv *level, ns int64) float64 {
	req, recent := lv.Latest(ns, t.latest)
	r := float64(max(recent, int64(time.Second)/4)) // a quarter second at least, against noise
	return (req + 2*math.Sqrt(req+1)) / r
}

// span returns the time the whole window's counts cover at ns: the
// window, or less since the first count.
func (t *Throttle) span(ns int64) float64 {
	span := t.windowNS
	if first := t.firstNS.Load(); first != 0 {
		span = min(span, float64(ns-first))
	}
	return max(span, t.shortNS)
}

// rejectP is the book's max(0, (requests - K*accepts) / (requests + 1)).
func rejectP(req, acc, k float64) float64 {
	p := (req - k*acc) / (req + 1)
	if p < 0 {
		return 0
	}
	return p
}

func (t *Throttle) probability(lv *level, ns int64) float64 {
	p, _, _, _ := t.decide(lv, ns)
	return min(p, t.maxP)
}

// Stats is a snapshot of one criticality's statistics.
type Stats struct {
	// Requests and Accepts are the counts the decision uses. After demand
	// fell, RejectProbability may be lower than they give (the demand
	// cap: at most K times the accepted rate is sent).
	Requests, Accepts float64
	// Short is true when they come from the short window.
	Short bool
	// RejectProbability is the probability the next request is rejected
	// locally.
	RejectProbability float64
}

// Stats returns the statistics of level l now, for metrics and tests.
func (t *Throttle) Stats(l criticality.Level) Stats { return t.stats(l, t.nowNS()) }

// StatsAt is Stats at time now.
func (t *Throttle) StatsAt(l criticality.Level, now time.Time) Stats { return t.stats(l, t.ns(now)) }

func (t *Throttle) stats(l criticality.Level, ns int64) Stats {
	p, req, acc, short := t.decide(t.level(l), ns)
	return Stats{Requests: req, Accepts: acc, Short: short, RejectProbability: min(p, t.maxP)}
}
