// Package admission implements backend admission control, SRE book ch. 21
// ("Utilization Signals", "Handling Overload Errors", the Conclusions) and
// the CRE post "Using load shedding to survive a success disaster": a task
// provisioned for a rate keeps serving that rate, at low latency, however
// much more is thrown at it, shedding lower criticalities first.
//
// A Controller sees every request twice, and where the transport can tell
// it three times:
//
//   - Arrive, as early as the transport allows (for gRPC, the tap handle at
//     stream arrival, before a handler goroutine exists): a bounded count of
//     pending requests, utilization signals with per-criticality thresholds,
//     and the deadline decide at once, cheaply, whether the request may
//     enter at all. When the task is full, an arriving request may take the
//     place of a waiting one of lower criticality; one whose client
//     already holds its share of the pending requests gets only the first
//     half of the room (ArriveOverShare), so that one client's burst
//     cannot lock the others out.
//   - Scheduled (optional), when the request's own goroutine first runs:
//     it no longer waits for the CPU, and until Start it holds no room, so
//     that a request whose message has not arrived waits on its client.
//   - Start, when the handler is about to run: the request takes one of L
//     execution slots, or waits for one in a queue served highest
//     criticality first, bounded in length and in time; Done gives the slot
//     back.
//   - Away and Back (optional), around a running request's wait on a call
//     to another service: the slot goes to the next waiter meanwhile, and
//     the wait is not service time. triage's client adapters call them
//     through intake.Handle.
//
// L is not configured: the controller finds it. Every Interval it compares
// the mean service time (Start to Done, less the time away) with its
// recent best; while the
// service time stays within Tolerance of the best and requests had to wait,
// L grows; when service time inflates (the executing requests compete for
// the CPU, or whatever else they share), L shrinks. A CPU-bound handler
// thus runs at a few slots per core, an I/O-bound one at many, with no
// hand-tuned limit.
//
// The requests admitted at arrival and not yet started are bounded by a
// pending cap, which keeps their queueing delay near a target: it shrinks
// while the delay exceeds the target and grows while it turns requests
// away with the delay well under it. The delay is measured on the server's
// side by default, as the time goroutines wait in Go's run queue
// (SchedulerDelay), so that a client slow to send its message is not
// mistaken for a queue (ArrivalDelay, the per-request alternative, ends at
// Scheduled where the transport calls it). Work conservation: while the
// task's CPU is clearly below saturation the cap does not shrink, since a
// task with idle CPU has no queue of runnable requests to bound; and while
// it also turns requests away, the cap grows in proportion to the CPU left
// idle, so that a client sending in bursts is served across its gaps. A
// request not Scheduled stops counting towards the cap four target delays
// after it arrived: its client is slow to send. When its message comes more than four target delays
// after its headers it ranks below the fresh requests of its level, and
// after the message timeout it is refused (Late).
//
// Deadline-aware shedding (the CRE post: the cheapest load to shed): a
// request whose deadline is closer than its expected wait plus service
// time is rejected before any work (an interval in which no request
// finished halves the expected service time: it is evidence no longer);
// a waiting request whose caller went away leaves the queue.
//
// Attempt histograms: the controller keeps a sliding count of the attempt
// counters of recent requests. When it must reject and a significant share
// of recent requests are retries (other tasks are likely overloaded too),
// it answers "overloaded; don't retry" instead of "task overloaded".
//
// Come back later (the CRE post: non-critical retryable requests are told
// to retry after a large interval): once SHEDDABLE or SHEDDABLE_PLUS has
// been shed for a second, its rejections carry a RetryAfter that grows
// with the spell, up to minutes, jittered (WithRetryAfter). Transports
// send it (gRPC RetryInfo, HTTP Retry-After) and package retry honours it.
//
// This package is transport-free; triagegrpc and triagehttp install it.
package admission

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/window"
	"github.com/triagehq/triage/outcome"
)

// ErrConfig is wrapped by every error New returns.
var ErrConfig = errors.New("admission: invalid config")

// Reason says why a request was rejected.
type Reason uint8

const (
	// Concurrency: no execution slot could be had (the task was full and
	// the request was not more critical than those waiting, it was
	// displaced by a more critical one, or it waited too long).
	Concurrency Reason = iota
	// Utilization: a utilization signal passed the request's threshold.
	Utilization
	// Deadline: the deadline would pass before the request could be
	// served.
	Deadline
	// Late: the request reached Start more than the message timeout after
	// it arrived (WithMessageTimeout): its client took that long to send
	// its message, and a slow sender is its own problem.
	Late
	// Forced: an operator's ForceShed drill rejected the request.
	Forced
	// NumReasons is the number of reasons.
	NumReasons
)

var reasonNames = [NumReasons]string{"concurrency", "utilization", "deadline", "late", "forced"}

// String returns the reason's metric name.
func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// Observer is told what a Controller decides. Methods must be cheap and
// safe for concurrent use; triageprom implements it.
type Observer interface {
	// Admitted: a request got an execution slot.
	Admitted(l criticality.Level)
	// Rejected: a request was rejected; dontRetry is true when the answer
	// was "overloaded; don't retry".
	Rejected(l criticality.Level, r Reason, dontRetry bool)
	// LimitChanged: the controller set a new execution limit.
	LimitChanged(limit int)
	// Degraded: Degrade told a request of level l to serve a degraded
	// answer.
	Degraded(l criticality.Level)
}

// Nop is an Observer that does nothing.
type Nop struct{}

func (Nop) Admitted(criticality.Level)               {}
func (Nop) Rejected(criticality.Level, Reason, bool) {}
func (Nop) LimitChanged(int)                         {}
func (Nop) Degraded(criticality.Level)               {}

// Defaults.
const (
	// DefaultInterval is how often the execution limit is revisited.
	DefaultInterval = 100 * time.Millisecond
	// DefaultTolerance is how much the mean service time may exceed its
	// recent best before the limit shrinks: 2x, i.e. requests may spend as
	// long waiting for the CPU (or whatever they share) as working.
	DefaultTolerance = 2.0
	// DefaultMaxWait bounds the time a request waits for an execution
	// slot: a request that cannot start within it is better rejected, so
	// that its client retries elsewhere while it still has time.
	DefaultMaxWait = 50 * time.Millisecond
	// DefaultTargetDelay is the mean time admitted requests may wait
	// before their handler starts. In a Go server whose handlers keep the
	// CPU busy, admitted requests queue as runnable goroutines, invisible
	// to any interceptor; this delay is how the controller sees that queue
	// and bounds it (CoDel's 5 ms target).
	DefaultTargetDelay = 5 * time.Millisecond
	// probeEvery is how many intervals pass between baseline probes (5 s
	// at the default interval); a probe runs one interval at the minimum
	// limit.
	probeEvery = 50
	// DefaultMaxLimit bounds the execution limit.
	DefaultMaxLimit = 10000
	// DefaultDontRetryRatio: when at least this share of recent requests
	// are retries, rejections say "overloaded; don't retry". Clients' retry
	// budgets keep retries under about 10% of requests even when every
	// task rejects, so a task seeing 5% retries is seeing other tasks
	// reject a large share of their traffic.
	DefaultDontRetryRatio = 0.05
	// DefaultMessageTimeout bounds the time from a request's arrival to
	// its Start under SchedulerDelay: for a gRPC unary call, the time its
	// client takes to send the message after its headers. A datacenter
	// client that needs longer is broken, overloaded or hostile.
	DefaultMessageTimeout = 500 * time.Millisecond
	// lateDelays: under SchedulerDelay, a request that reaches Start more
	// than this many target delays after it arrived is late: the server's
	// queue cannot explain the wait, its client was slow to send. It
	// stopped counting towards the pending cap (the prestart ring's epoch
	// is the target delay, four slots), and it ranks below every fresh
	// request of its level.
	lateDelays = prestartSlots
	// DefaultHistoryWindow is the attempt histogram's window.
	DefaultHistoryWindow = 10 * time.Second
	// dontRetryMinRequests is the number of recent requests the histogram
	// needs before it is believed.
	dontRetryMinRequests = 20
	// DefaultQueueFactor is the waiting queue's length as a multiple of
	// the execution limit, plus queueSlack.
	DefaultQueueFactor = 4
	// DefaultMaxStalled is how many requests may be stalled at once
	// (WithMaxStalled).
	DefaultMaxStalled = 4096
	// queueSlack is room in the waiting queue beyond QueueFactor x limit,
	// so that a task at a limit of one still queues a few.
	queueSlack = 8
	// pendingPerLimit bounds the pending cap: at most this many admitted
	// requests per execution slot at the largest limit.
	pendingPerLimit = 8
	// sampleAbove is the number of measured requests per interval above
	// which only one request in sampleMaskHeavy+1 is measured.
	sampleAbove     = 256
	sampleMaskHeavy = 7
	// saturatedAt is the saturation signal's reading from which the CPU
	// counts as saturated and the pending cap applies (WithSaturation):
	// clearly below it, no queue of runnable requests can form.
	saturatedAt = 0.95
)

// Option configures a Controller.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	clock          clock.Clock
	random         func() float64
	obs            Observer
	interval       time.Duration
	tolerance      float64
	minLimit       int
	maxLimit       int
	initialLimit   int
	maxWait        time.Duration
	targetDelay    time.Duration
	queueFactor    int
	dontRetryRatio float64
	historyWindow  time.Duration
	gates          []gate
	delay          DelayMeasure
	messageTimeout time.Duration
	saturation     Signal
	saturationSet  bool
	retryAfterMin  time.Duration
	retryAfterMax  time.Duration
	maxStalled     int
}

type gate struct {
	sig Signal
	th  Thresholds
}

// WithClock sets the clock. Default clock.Real().
func WithClock(c clock.Clock) Option { return optionFunc(func(cfg *config) { cfg.clock = c }) }

// WithRandom sets the uniform [0, 1) source for progressive shedding and
// for choosing which requests are measured, so that a simulation on
// virtual time is reproducible. Default math/rand/v2.
func WithRandom(f func() float64) Option { return optionFunc(func(c *config) { c.random = f }) }

// WithObserver sets the Observer. Default Nop.
func WithObserver(o Observer) Option { return optionFunc(func(c *config) { c.obs = o }) }

// WithSignal adds a utilization signal with its per-criticality
// thresholds. A request is rejected by the first signal whose draw says so.
// Default: none; the execution limit alone protects latency. Add CPU,
// Memory, ExecutorLoad or your own.
func WithSignal(s Signal, t Thresholds) Option {
	return optionFunc(func(c *config) { c.gates = append(c.gates, gate{s, t}) })
}

// WithInterval sets how often the execution limit is revisited. Default
// DefaultInterval.
func WithInterval(d time.Duration) Option { return optionFunc(func(c *config) { c.interval = d }) }

// WithTolerance sets how far the mean service time may exceed its recent
// best before the limit shrinks (> 1). Default DefaultTolerance.
func WithTolerance(f float64) Option { return optionFunc(func(c *config) { c.tolerance = f }) }

// WithLimits bounds the execution limit: min, initial and max. Defaults:
// GOMAXPROCS, 2 x GOMAXPROCS, DefaultMaxLimit.
func WithLimits(min, initial, max int) Option {
	return optionFunc(func(c *config) { c.minLimit, c.initialLimit, c.maxLimit = min, initial, max })
}

// WithMaxWait bounds the time a request waits for an execution slot.
// Default DefaultMaxWait. While the task's refusals say "don't retry"
// (many recent requests are retries), a CRITICAL or CRITICAL_PLUS request
// with a deadline waits until its deadline instead, also when that starts
// during its wait: nobody would retry it elsewhere.
func WithMaxWait(d time.Duration) Option { return optionFunc(func(c *config) { c.maxWait = d }) }

// WithTargetDelay sets the mean time an admitted request may wait between
// arriving and its handler starting (in the Go run queue and the
// transport, where no interceptor can see it) before the controller admits
// fewer. Default DefaultTargetDelay.
func WithTargetDelay(d time.Duration) Option {
	return optionFunc(func(c *config) { c.targetDelay = d })
}

// WithDelayMeasure sets how the queueing delay that bounds the pending
// cap is measured. Default: SchedulerDelay on the real clock, ArrivalDelay
// under WithClock (the scheduler's latencies are in real time).
func WithDelayMeasure(m DelayMeasure) Option { return optionFunc(func(c *config) { c.delay = m }) }

// WithMessageTimeout bounds, under SchedulerDelay, the time from a
// request's Arrive to its Start: a request that reaches Start later is
// refused (reason Late) before any work. Default DefaultMessageTimeout.
func WithMessageTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.messageTimeout = d })
}

// WithSaturation sets the signal that says how busy the task's CPU is
// (work conservation): while it reads below 0.95, the pending cap does not
// shrink, since a task with idle CPU has no queue of runnable requests to
// bound, and while the cap turns requests away it grows each interval by
// four times the idle share of itself (at least a tenth, at most
// doubling: 90% busy, +40%);
// execution slots, their queue and the deadline still apply. nil turns
// the rule off (the cap follows the delay alone). Default: the process's
// CPU against its reservation, sampled every half interval (CPU{Interval:
// WithInterval / 2}), on the real clock; none under WithClock.
func WithSaturation(s Signal) Option {
	return optionFunc(func(c *config) { c.saturation, c.saturationSet = s, true })
}

// WithQueueFactor sets the waiting queue's length as a multiple of the
// execution limit (plus 8). Default 4.
func WithQueueFactor(n int) Option { return optionFunc(func(c *config) { c.queueFactor = n }) }

// WithDontRetryRatio sets the share of retries in recent requests above
// which rejections say "overloaded; don't retry" (in (0, 1]; 1 disables it
// in practice). Default DefaultDontRetryRatio.
func WithDontRetryRatio(r float64) Option {
	return optionFunc(func(c *config) { c.dontRetryRatio = r })
}

// WithMaxStalled bounds the requests stalled at once (Stall): a request
// that would stall past it keeps its execution slot while it waits on its
// client. Default DefaultMaxStalled; at most 2^20.
func WithMaxStalled(n int) Option { return optionFunc(func(c *config) { c.maxStalled = n }) }

// Controller is one task's admission control. It is safe for concurrent
// use. Its memory is bounded: the waiting queue holds at most
// QueueFactor x limit + 8 requests (limit <= MaxLimit), admitted requests
// are bounded by the pending cap (<= 8 x MaxLimit, plus criticality
// headroom), and the attempt histogram and the count of requests not yet
// started are fixed rings. A request that is admitted but never reaches
// Start or Done (its stream ended before a handler ran, or its message is
// slow to come) stops counting towards the cap after four target delays
// (SchedulerDelay) or three to four seconds (ArrivalDelay); nothing needs a
// per-request callback. It
// starts no goroutines; everything it revisits (the limit, signals) is
// revisited by the requests themselves.
type Controller struct {
	start   time.Time
	since   func() time.Duration
	clock   clock.Clock
	random  func() float64
	seeded  bool // random was given: sampling draws from it too
	obs     Observer
	gates   []gate
	maxWait time.Duration
	// messageTimeout and lateAfter (ns) judge a request's lateness at
	// Start under SchedulerDelay; lateAfter 0 (ArrivalDelay): never late.
	messageTimeout, lateAfter int64
	// sched measures the queueing delay (SchedulerDelay); nil: sampled
	// requests measure it from Arrive to Start (ArrivalDelay).
	sched *schedDelay
	// saturation says how busy the CPU is (work conservation); nil:
	// saturated always.
	saturation Signal
	busy       float64 // its last reading; guarded by adjust

	targetDelay    int64
	interval       int64
	tolerance      float64
	minLimit       int64
	maxLimit       int64
	queueFactor    int64
	dontRetryRatio float64
	attempts       *window.Counter // A: requests, B: retries
	adjust         sync.Mutex      // held while revisiting the limit and the pending cap
	limits         limitRule
	ls             limitState // guarded by adjust
	pending        pendingRule
	probingNow     atomic.Bool         // ls.probing, for wait (read without c.adjust)
	probeResume    atomic.Int64        // ls.resume, for wait
	mu             sync.Mutex          // guards the queues
	queues         [returning + 1]fifo // by rank; returning: stalled requests coming back

	// hot holds every counter that every request writes, on one cache
	// line (docs/rationale.md, "One cache line").
	hot *hotLine
	// Read-mostly words, then the words sampled requests write.
	_           [64]byte
	limit       atomic.Int64
	queued      atomic.Int64
	away        atomic.Int64 // running requests waiting on a downstream call (Away)
	stalled     atomic.Int64 // running requests waiting on their own client (Stall)
	maxStalled  int64        // bound on stalled (WithMaxStalled)
	saturated   atomic.Bool  // the pending cap applies: see WithSaturation
	nextAdjust  atomic.Int64
	expectedSvc atomic.Int64 // ns, last interval's mean service time
	lastDelay   atomic.Int64 // ns, last interval's mean wait before Start
	// sampleMask selects the requests whose service time is measured and
	// which enter the attempt histogram (rand & mask == 0): all under light
	// traffic, one in eight under heavy, which spares clock reads and
	// shared writes.
	sampleMask atomic.Uint32
	waited     atomic.Bool
	// pendingCap bounds the requests admitted at arrival and not yet done
	// (for the higher criticalities, a share more: headroom), in
	// thousandths of a request: for costly work the right bound is a
	// request or two, and headroom is a share of that.
	pendingCap atomic.Int64
	capHit     atomic.Bool
	_          [64]byte
	recent     atomic.Int64 // the clock as the last sampled arrival read it
	lastShed   atomic.Int64 // ns of a recent rejection (kept within interval/16)
	_          [48]byte
	// Requests between Arrive and Start are counted per epoch of arrival
	// in a ring of four (the counts are in hot): a request that never
	// reaches Start (its stream reset before the handler ran, an unknown
	// method) stops counting after three to four epochs, without any
	// per-request callback.
	prestart      prestartRing
	prestartEpoch int64
	// Per criticality, read-mostly: how many not-started requests were
	// displaced by more critical arrivals and must be refused at Start
	// (owed); and a smoothed peak of the occupancy (usual, x1000,
	// revisited every interval): the room less critical requests leave
	// free for the more critical ones. The occupancy itself is in hot.
	lv         [criticality.NumLevels]levelCounters
	svcSum     atomic.Int64
	svcCount   atomic.Int64
	delaySum   atomic.Int64 // sampled time from Arrive to Start
	delayCount atomic.Int64
	_          [32]byte
	// errs are the prebuilt rejections, per reason and kind (task
	// overloaded, don't retry), indexed by retrySlot.
	errs [NumReasons][2][]*outcome.Error
	// drills is, per level, the operator's ForceShed drill; forcedAny
	// says whether one was ever set.
	drills    [criticality.NumLevels]forcedShed
	forcedAny atomic.Bool
	// attempted is the attempt histogram's running total (Attempts).
	attempted [criticality.NumLevels][AttemptBuckets]atomic.Uint64
	// shed is, per level, the current spell of rejections (the sheddable
	// levels' RetryAfter grows with it).
	shed                 [criticality.NumLevels]spell
	retryMin, retryQuiet int64
	retryBuckets         int
}

// validate refuses a configuration the Controller cannot run with.
func (c *config) validate() error {
	switch {
	case c.interval < time.Millisecond:
		return fmt.Errorf("%w: interval must be at least 1ms, got %v", ErrConfig, c.interval)
	case !(c.tolerance > 1) || math.IsInf(c.tolerance, 0):
		return fmt.Errorf("%w: tolerance must be > 1, got %v", ErrConfig, c.tolerance)
	case c.minLimit < 1 || c.initialLimit < c.minLimit || c.maxLimit < c.initialLimit || c.maxLimit > 1<<20:
		return fmt.Errorf("%w: limits need 1 <= min <= initial <= max <= 2^20, got %d, %d, %d", ErrConfig, c.minLimit, c.initialLimit, c.maxLimit)
	case c.maxWait <= 0:
		return fmt.Errorf("%w: max wait must be positive, got %v", ErrConfig, c.maxWait)
	case c.targetDelay <= 0:
		return fmt.Errorf("%w: target delay must be positive, got %v", ErrConfig, c.targetDelay)
	case c.queueFactor < 0 || c.queueFactor > 64:
		return fmt.Errorf("%w: queue factor must be in [0, 64], got %d", ErrConfig, c.queueFactor)
	case c.messageTimeout <= 0:
		return fmt.Errorf("%w: message timeout must be positive, got %v", ErrConfig, c.messageTimeout)
	case c.delay > ArrivalDelay:
		return fmt.Errorf("%w: unknown delay measure %d", ErrConfig, c.delay)
	case !(c.dontRetryRatio > 0 && c.dontRetryRatio <= 1):
		return fmt.Errorf("%w: don't-retry ratio must be in (0, 1], got %v", ErrConfig, c.dontRetryRatio)
	}
	if err := c.validateRetryAfter(); err != nil {
		return err
	}
	for _, g := range c.gates {
		if g.sig == nil {
			return fmt.Errorf("%w: nil signal", ErrConfig)
		}
		if err := g.th.validate(); err != nil {
			return err
		}
	}
	return nil
}

// New returns a Controller.
func New(opts ...Option) (*Controller, error) {
	procs := runtime.GOMAXPROCS(0)
	c := config{
		interval:       DefaultInterval,
		tolerance:      DefaultTolerance,
		minLimit:       procs,
		initialLimit:   2 * procs,
		maxLimit:       DefaultMaxLimit,
		maxWait:        DefaultMaxWait,
		targetDelay:    DefaultTargetDelay,
		queueFactor:    DefaultQueueFactor,
		dontRetryRatio: DefaultDontRetryRatio,
		historyWindow:  DefaultHistoryWindow,
		messageTimeout: DefaultMessageTimeout,
		retryAfterMin:  DefaultRetryAfterMin,
		retryAfterMax:  DefaultRetryAfterMax,
		maxStalled:     DefaultMaxStalled,
	}
	for _, o := range opts {
		o.apply(&c)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	clk := clock.OrReal(c.clock)
	ctl := &Controller{
		start:          clk.Now(),
		clock:          clk,
		random:         c.random,
		obs:            c.obs,
		gates:          c.gates,
		maxWait:        c.maxWait,
		targetDelay:    int64(c.targetDelay),
		interval:       int64(c.interval),
		tolerance:      c.tolerance,
		minLimit:       int64(c.minLimit),
		maxLimit:       int64(c.maxLimit),
		queueFactor:    int64(c.queueFactor),
		dontRetryRatio: c.dontRetryRatio,
		maxStalled:     int64(c.maxStalled),
		attempts:       window.New(int64(c.historyWindow/20), 20, 1),
	}
	ctl.since = clock.SinceFunc(clk, ctl.start)
	ctl.prestartEpoch = prestartEpoch
	if c.delay == SchedulerDelay || c.delay == 0 && c.clock == nil {
		ctl.sched = newSchedDelay()
		ctl.prestartEpoch = int64(c.targetDelay)
		ctl.lateAfter = lateDelays * int64(c.targetDelay)
	}
	ctl.messageTimeout = int64(c.messageTimeout)
	if !c.saturationSet && c.clock == nil {
		if sig, err := (CPU{Interval: c.interval / 2}).Signal(); err == nil {
			c.saturation = sig
		}
	}
	ctl.saturation = c.saturation
	ctl.saturated.Store(true)
	ctl.busy = 1
	if ctl.random == nil {
		ctl.random = rand.Float64
	} else {
		ctl.seeded = true
	}
	if ctl.obs == nil {
		ctl.obs = Nop{}
	}
	ctl.hot = new(hotLine)
	ctl.prestart.init(&ctl.hot.prestart, &ctl.lv)
	ctl.limit.Store(int64(c.initialLimit))
	ctl.pendingCap.Store(milli * (2*int64(c.initialLimit) + ctl.queueCap(int64(c.initialLimit))))
	ctl.nextAdjust.Store(int64(c.interval))
	ctl.lastShed.Store(math.MinInt64 / 2)
	ctl.limits = limitRule{min: ctl.minLimit, max: ctl.maxLimit, tolerance: c.tolerance, probeEvery: probeEvery}
	ctl.ls = limitState{limit: int64(c.initialLimit), best: math.MaxInt64}
	ctl.pending = pendingRule{target: ctl.targetDelay, floor: minPendingCap, ceiling: ctl.maxLimit * pendingPerLimit * milli}
	ctl.buildErrs(c.retryAfterMin, c.retryAfterMax)
	return ctl, nil
}

func (c *Controller) now() int64 { return int64(c.since()) }

const (
	prestartSlots = 4
	// prestartEpoch is the prestart ring's epoch when queueing delay is
	// measured from Arrive to Start: a request that never reaches Start
	// stops counting after three to four seconds.
	prestartEpoch = int64(time.Second)
)

// hotLine is the counters every request writes. It is 64 bytes, and Go
// allocates a 64-byte object at a multiple of 64: one cache line.
type hotLine struct {
	// executing counts the requests holding an execution slot.
	executing atomic.Int64
	// prestart counts the admitted requests not yet started, per epoch of
	// arrival (a slot of prestartRing) and criticality: four signed 16-bit
	// counts per word, one per level (see slotCount).
	prestart [prestartSlots]atomic.Int64
	// started counts, per criticality, the requests between Start and
	// Done.
	started [criticality.NumLevels]atomic.Int32
	_       [8]byte
}

// levelUnit is one request of level l in a prestart word.
func levelUnit(l criticality.Level) int64 { return 1 << (16 * uint(l)) }

// A prestart word holds four signed 16-bit counts, each added into the
// word at its place, so the word is their weighted sum whatever their
// signs (a count may dip below zero for a moment when a removal races
// with a rotation). Adding slotBias makes every place non-negative, so
// that each count is read with a shift and a mask.
const slotBias = 0x8000_8000_8000_8000

// slotLevel decodes the count of level l from a prestart word.
func slotLevel(w int64, l criticality.Level) int64 {
	return int64((uint64(w)+slotBias)>>(16*uint(l))&0xffff) - 1<<15
}

// slotTotal decodes the sum of a prestart word's four counts.
func slotTotal(w int64) int64 {
	u := uint64(w) + slotBias
	s := u&0x0000_ffff_0000_ffff + u>>16&0x0000_ffff_0000_ffff
	return int64(s&0xffff_ffff+s>>32) - 4<<15
}

// maxSlotCount bounds the requests of one level admitted and not started
// in one epoch, so that a count never leaves its 16 bits (concurrent
// arrivals may each pass the check at once: the margin covers them).
const maxSlotCount = 1<<15 - 1<<11

// prestartRing counts admitted requests that have not reached Start, by
// epoch of arrival and criticality, in four slots of the Controller's hot
// line: counting is one atomic add. A slot four or more epochs old is
// dropped at the first arrival of a new epoch: its requests (their stream
// was reset before the handler ran, or the method is unknown) stop
// counting, towards the pending cap and among their level's not-started
// requests alike, and their level's eviction debt is cut to what is left.
// The slots are the only record of requests not started, so nothing else
// needs correcting when one is dropped.
type prestartRing struct {
	cur    atomic.Int64
	rot    sync.Mutex
	epochs [prestartSlots]atomic.Int64
	counts *[prestartSlots]atomic.Int64
	lv     *[criticality.NumLevels]levelCounters
}

// noEpoch marks a dropped slot.
const noEpoch = math.MinInt64

func (r *prestartRing) init(counts *[prestartSlots]atomic.Int64, lv *[criticality.NumLevels]levelCounters) {
	r.counts, r.lv = counts, lv
	r.cur.Store(math.MinInt64 / 2)
	for i := range r.epochs {
		r.epochs[i].Store(noEpoch)
	}
}

// rotate makes e the current epoch, dropping the slots of epochs four or
// more before it.
func (r *prestartRing) rotate(e int64) {
	r.rot.Lock()
	defer r.rot.Unlock()
	if e <= r.cur.Load() {
		return
	}
	dropped := false
	for i := range r.epochs {
		if ep := r.epochs[i].Load(); ep > e-prestartSlots && ep < e {
			continue
		}
		// Also a dropped slot: an add racing with its drop may have
		// counted there.
		if r.counts[i].Swap(0) != 0 {
			dropped = true
		}
		r.epochs[i].Store(noEpoch)
	}
	r.epochs[e%prestartSlots].Store(e)
	r.cur.Store(e)
	if !dropped {
		return
	}
	for l := range r.lv {
		left := max(r.level(criticality.Level(l)), 0)
		for {
			owed := r.lv[l].owed.Load()
			if owed <= left || r.lv[l].owed.CompareAndSwap(owed, left) {
				break
			}
		}
	}
}

// add counts an arrival of level l in epoch e, or in the current epoch if
// e's slot is gone (a stale clock reading), and returns the epoch it was
// counted in; false if the slot already holds maxSlotCount requests of
// level l. A rotation between the check and the add counts the request in
// the slot's next epoch, where it stops counting an epoch or so late.
func (r *prestartRing) add(e int64, l criticality.Level) (int64, bool) {
	if e > r.cur.Load() {
		r.rotate(e)
	}
	if r.epochs[e%prestartSlots].Load() != e {
		e = r.cur.Load()
	}
	w := &r.counts[e%prestartSlots]
	if slotLevel(w.Load(), l) >= maxSlotCount {
		return 0, false
	}
	w.Add(levelUnit(l))
	return e, true
}

// remove takes a request of level l counted in epoch e out of the slots.
// If its slot was dropped meanwhile, it is no longer counted: nothing to
// do.
func (r *prestartRing) remove(e int64, l criticality.Level) {
	if i := e % prestartSlots; r.epochs[i].Load() == e {
		r.counts[i].Add(-levelUnit(l))
	}
}

// total is the requests counted, once the ring is at epoch e.
func (r *prestartRing) total(e int64) int64 {
	if e > r.cur.Load() {
		r.rotate(e)
	}
	var n int64
	for i := range r.counts {
		n += slotTotal(r.counts[i].Load())
	}
	return n
}

// level is the requests of level l counted.
func (r *prestartRing) level(l criticality.Level) int64 {
	var n int64
	for i := range r.counts {
		n += slotLevel(r.counts[i].Load(), l)
	}
	return n
}

// occupancy is the requests admitted and not done: those not yet started
// (arrived within the last three to four seconds), waiting and running.
func (c *Controller) occupancy(now int64) int64 {
	return c.prestart.total(now/c.prestartEpoch) + c.queued.Load() + c.hot.executing.Load() + c.away.Load()
}

// Ticket follows one request from Arrive to Done. Adapters keep it with
// the request (the gRPC adapter in the request's context node) and pass a
// pointer to Start and Done; the zero Ticket is not admitted.
type Ticket struct {
	arrive, started int64
	epoch           int64 // of the prestart ring it was counted in
	awayAt, awayFor int64 // sampled: the last Away, the time spent away before it
	level           criticality.Level
	state           uint8
	sampled         bool // measured: delay before Start, service time
}

// Level returns the request's criticality.
func (t *Ticket) Level() criticality.Level { return t.level }

const (
	ticketPending   uint8 = iota + 1 // arrived, Start not called
	ticketScheduled                  // its goroutine ran (Scheduled), Start not called
	ticketInside                     // in Start: waiting, or rejected there
	ticketRunning                    // holds an execution slot
	ticketAway                       // running, waiting on a downstream call without a slot
	ticketStalled                    // running, waiting on its own client without a slot or room
	ticketDone
)

// Arrive decides whether a request of level l, carrying attempt counter
// attempt and the given deadline (zero: none), may enter the task. On
// admission it fills t and returns nil; the caller must then call Start (or
// Done, if the request ends before its handler runs) and Done. On rejection
// it returns an *outcome.Error of kind TaskOverloaded or DontRetry whose
// Reason is the Reason's name; the errors are shared and must not be
// modified. Arrive does not allocate.
func (c *Controller) Arrive(t *Ticket, l criticality.Level, attemptN int, deadline time.Time) error {
	return c.arrive(t, l, attemptN, deadline, false)
}

// ArriveOverShare is Arrive for a request whose client already holds its
// share of the requests admitted and not yet running (to the gRPC
// adapter, ConnShare streams of its connection waiting for their
// goroutines): it is admitted only into the first half of the task's
// room, so that one client's burst, which fills the room until its
// requests run, leaves the other half to the other clients. A client
// alone still gets the whole task in time: its requests wait less, and
// the pending cap grows.
func (c *Controller) ArriveOverShare(t *Ticket, l criticality.Level, attemptN int, deadline time.Time) error {
	return c.arrive(t, l, attemptN, deadline, true)
}

func (c *Controller) arrive(t *Ticket, l criticality.Level, attemptN int, deadline time.Time, overShare bool) error {
	if !l.Valid() {
		l = criticality.Default
	}
	// Under heavy traffic only sampled requests read the clock; the others
	// take the time the last sampled one read, a few requests old. It
	// serves the interval, the second of arrival and the deadline check,
	// none of which needs better.
	var draw uint32
	if c.seeded {
		draw = uint32(c.random() * (1 << 32))
	} else {
		draw = rand.Uint32()
	}
	sampled := draw&c.sampleMask.Load() == 0
	var now int64
	if sampled {
		now = c.now()
		c.recent.Store(now)
	} else {
		now = c.recent.Load()
	}
	c.maybeAdjust(now)
	if sampled {
		retry := uint32(0)
		if attemptN > 0 {
			retry = 1
		}
		c.attempts.Add(now, 1, retry)
		c.attempted[l][min(max(attemptN, 0), AttemptBuckets-1)].Add(uint64(c.sampleMask.Load()) + 1)
	}
	if c.forcedAny.Load() && c.forcedOut(l, now) {
		return c.reject(l, Forced, now)
	}
	for i := range c.gates {
		g := &c.gates[i]
		if p := g.th.rejectP(l, g.sig.Utilization()); p > 0 && (p >= 1 || c.random() < p) {
			return c.reject(l, Utilization, now)
		}
	}
	if !deadline.IsZero() {
		left := int64(deadline.Sub(c.start)) - now
		if left <= c.expectedWaitAndService() {
			return c.reject(l, Deadline, now)
		}
	}
	room := c.capFor(l)
	if overShare {
		room = (room + 1) / 2
	}
	if c.occupancy(now)+c.reserved(l)+1 > room && !c.evictBelow(l) {
		c.capHit.Store(true)
		return c.reject(l, Concurrency, now)
	}
	e, ok := c.prestart.add(now/c.prestartEpoch, l)
	if !ok {
		c.capHit.Store(true)
		return c.reject(l, Concurrency, now)
	}
	*t = Ticket{arrive: now, epoch: e, level: l, state: ticketPending, sampled: sampled}
	return nil
}

func (c *Controller) queueCap(limit int64) int64 { return c.queueFactor*limit + queueSlack }

// headroom is how far past the pending cap each criticality may still be
// admitted, in percent: when the task is full, SHEDDABLE is refused first,
// then SHEDDABLE_PLUS, CRITICAL, CRITICAL_PLUS. The higher classes are
// admitted beyond the cap rather than the lower ones held below it, so that
// the task stays work-conserving: with only SHEDDABLE traffic, SHEDDABLE
// uses all of it. The cap is small (about 5 ms of work when the task is full
// of one class: the cap shrinks until the wait meets the target whatever
// the headroom), so CRITICAL's 3x and CRITICAL_PLUS's 5x cost little
// queueing; they are this large because critical requests arrive in bursts
// that must not find the room taken (docs/rationale.md, "Headroom").
var headroom = [criticality.NumLevels]int64{0, 25, 200, 400}

type levelCounters struct {
	owed, usual atomic.Int64
}

// levelOccupancy is the requests of level l admitted and not done.
func (c *Controller) levelOccupancy(l criticality.Level) int64 {
	return max(c.notStarted(l), 0) + int64(c.hot.started[l].Load())
}

// notStarted is the requests of level l between Arrive and Start.
func (c *Controller) notStarted(l criticality.Level) int64 { return c.prestart.level(l) }

// reserved is the room a request of level l must leave free for the more
// critical ones: their usual occupancy, less what they occupy now. Lower
// criticalities are thus admitted into what the higher ones do not use;
// with no more critical traffic, nothing is reserved.
func (c *Controller) reserved(l criticality.Level) int64 {
	var r int64
	for h := l + 1; h < criticality.NumLevels; h++ {
		if u := (c.lv[h].usual.Load() + 999) / 1000; u > 0 {
			r += max(u-c.levelOccupancy(h), 0)
		}
	}
	return r
}

// capFor is the occupancy a request of level l may reach: the pending cap
// plus the level's headroom, rounded up to whole requests, so that every
// level may have at least one request in the task.
func (c *Controller) capFor(l criticality.Level) int64 {
	p := c.pendingCap.Load() * (100 + headroom[l])
	return (p + 100*milli - 1) / (100 * milli)
}

// milli is the pending cap's unit: a thousandth of a request.
const milli = 1000

// minPendingCap is the pending cap's floor, in thousandths: a tenth of a
// request, which still admits one request of every level.
const minPendingCap = milli / 10

// expectedWaitAndService is the time a request arriving now would take:
// the recent wait before Start, the queue for slots divided among them,
// and one service time.
func (c *Controller) expectedWaitAndService() int64 {
	svc := c.expectedSvc.Load()
	limit := c.limit.Load()
	return c.lastDelay.Load() + svc + c.queued.Load()*svc/limit
}

func (c *Controller) reject(l criticality.Level, r Reason, now int64) error {
	if now-c.lastShed.Load() > c.interval/16 {
		c.lastShed.Store(now)
	}
	dr := 0
	if c.retriesHigh(now) {
		dr = 1
	}
	c.obs.Rejected(l, r, dr == 1)
	return c.errs[r][dr][c.retrySlot(l, now)]
}

// retriesHigh reports whether the share of retries among recent requests
// is at least the don't-retry ratio: rejections then say "overloaded;
// don't retry".
func (c *Controller) retriesHigh(now int64) bool {
	w, _ := c.attempts.Sums(now)
	return w.A >= dontRetryMinRequests/float64(c.sampleMask.Load()+1) && w.B >= c.dontRetryRatio*w.A
}

// Start gives the request an execution slot, waiting for one if needed (at
// most MaxWait, never past ctx's deadline, highest criticality first). It
// returns nil when the handler may run, or a rejection error (Concurrency,
// or Deadline when the deadline would pass while waiting) or ctx's error.
// Either way the caller calls Done afterwards.
func (c *Controller) Start(ctx context.Context, t *Ticket) error {
	scheduled := t.state == ticketScheduled
	switch t.state {
	case ticketPending:
		c.prestart.remove(t.epoch, t.level)
		c.hot.started[t.level].Add(1)
	case ticketScheduled:
		c.hot.started[t.level].Add(1)
	default:
		return errors.New("admission: Start without Arrive")
	}
	t.state = ticketInside
	if c.displaced(t.level) {
		return c.reject(t.level, Concurrency, c.now())
	}
	late := false
	if t.sampled {
		t.started = c.now()
		if !scheduled {
			c.addDelay(t.started - t.arrive)
		}
	}
	if c.lateAfter > 0 {
		now := t.started
		if !t.sampled {
			now = c.recent.Load()
		}
		if now-t.arrive > c.messageTimeout {
			return c.reject(t.level, Late, now)
		}
		late = now-t.arrive > c.lateAfter
	}
	if c.queued.Load() == 0 && c.tryAcquire() {
		return c.started(t, false)
	}
	return c.wait(ctx, t, late)
}

func (c *Controller) started(t *Ticket, waited bool) error {
	t.state = ticketRunning
	if t.sampled && waited {
		t.started = c.now() // service starts when the slot is given
	}
	c.obs.Admitted(t.level)
	return nil
}

func (c *Controller) tryAcquire() bool {
	for {
		e, l := c.hot.executing.Load(), c.limit.Load()
		if e >= l {
			return false
		}
		if c.hot.executing.CompareAndSwap(e, e+1) {
			return true
		}
	}
}

// Done ends the request: it gives back its execution slot, if it had one,
// and its place among the pending requests. Done on a Ticket that is not
// admitted, or a second time, does nothing.
func (c *Controller) Done(t *Ticket) {
	switch t.state {
	case ticketRunning:
		if t.sampled {
			c.addService(t, c.now())
		}
		c.release()
		c.hot.started[t.level].Add(-1)
	case ticketAway:
		if t.sampled {
			now := c.now()
			t.awayFor += now - t.awayAt
			c.addService(t, now)
		}
		c.away.Add(-1)
		c.hot.started[t.level].Add(-1)
	case ticketStalled:
		if t.sampled {
			now := c.now()
			t.awayFor += now - t.awayAt
			c.addService(t, now)
		}
		c.stalled.Add(-1)
	case ticketInside:
		c.hot.started[t.level].Add(-1)
	case ticketPending:
		c.prestart.remove(t.epoch, t.level)
	case ticketScheduled:
	default:
		return
	}
	t.state = ticketDone
}

// addService counts a sampled request's service time: from Start to now,
// less its time away.
func (c *Controller) addService(t *Ticket, now int64) {
	c.svcSum.Add(max(now-t.started-t.awayFor, 1))
	c.svcCount.Add(1)
}

// Away tells the Controller that a running request now waits on a call
// to another service: it gives its execution slot to the next waiter
// until Back, and the wait does not count in its service time, so that a
// task whose handlers wait on slow downstreams neither runs out of slots
// nor shrinks its limit for it (the downstream sheds its own load). The
// request still counts among those the task holds (the pending cap and
// its criticality's occupancy). triage's client adapters call it, through
// the request's context, around every outgoing call (intake.Handle).
//
// Away and Back alternate, on one goroutine at a time, between Start and
// Done; Away does nothing unless the request holds a slot, Back unless
// it is away. Back takes a slot back at once, even past the limit: the
// request was admitted and has work to finish.
func (c *Controller) Away(t *Ticket) {
	if t.state != ticketRunning {
		return
	}
	t.state = ticketAway
	if t.sampled {
		t.awayAt = c.now()
	}
	c.away.Add(1)
	c.release()
}

// Back ends a wait begun with Away.
func (c *Controller) Back(t *Ticket) {
	if t.state != ticketAway {
		return
	}
	t.state = ticketRunning
	if t.sampled {
		t.awayFor += c.now() - t.awayAt
	}
	c.hot.executing.Add(1)
	c.away.Add(-1)
}

// Stall tells the Controller that a running request now waits on its
// own client: a response it sends blocks because the client does not
// read it, or it waits for the client's next message. Until Unstall the
// request gives its execution slot to the next waiter and, unlike Away,
// takes no room either (the pending cap and its criticality's
// occupancy): a client that stops reading holds its own stream, not the
// task. The wait does not count in its service time. Adapters call it,
// through intake.Handle, once the request has waited on its client for
// the target delay (WithTargetDelay). It reports whether the request is
// stalled: at most WithMaxStalled requests are at once, and one past that
// keeps its slot.
//
// Stall and Unstall alternate, on one goroutine at a time, with Away and
// Back between Start and Done; Stall does nothing unless the request
// holds a slot, Unstall unless it is stalled.
func (c *Controller) Stall(t *Ticket) bool {
	if t.state != ticketRunning {
		return false
	}
	for {
		n := c.stalled.Load()
		if n >= c.maxStalled {
			return false
		}
		if c.stalled.CompareAndSwap(n, n+1) {
			break
		}
	}
	t.state = ticketStalled
	if t.sampled {
		t.awayAt = c.now()
	}
	c.hot.started[t.level].Add(-1)
	c.release()
	return true
}

// Unstall ends a wait begun with Stall: the request takes its room back
// and waits for an execution slot, never past the limit, ahead of every
// request that has not started (a stalled request was admitted and has
// work to finish), until it gets one or ctx ends. It returns nil with a
// slot, or ctx's error; then the request stays stalled, holding no slot,
// until Done (its handler is about to end) or a later Unstall.
func (c *Controller) Unstall(ctx context.Context, t *Ticket) error {
	if t.state != ticketStalled {
		return nil
	}
	if c.queued.Load() > 0 || !c.tryAcquire() {
		if err := c.awaitReturn(ctx); err != nil {
			return err
		}
	}
	t.state = ticketRunning
	if t.sampled {
		t.awayFor += c.now() - t.awayAt
	}
	c.hot.started[t.level].Add(1)
	c.stalled.Add(-1)
	return nil
}

// TargetDelay is the mean wait before Start the Controller aims at
// (WithTargetDelay); a send blocked this long is stalled (Stall).
func (c *Controller) TargetDelay() time.Duration { return time.Duration(c.targetDelay) }

// MessageTimeout is how long after its headers a request's message may
// come (WithMessageTimeout): Start refuses a later one (Late), and
// adapters that read the message themselves stop waiting for it then.
func (c *Controller) MessageTimeout() time.Duration { return time.Duration(c.messageTimeout) }

// Scheduled tells the Controller that an admitted request's own goroutine
// has begun to run, before Start: it no longer waits for the CPU. From
// then until Start it counts neither towards the pending cap nor among
// its level's requests not started, so that a request whose message has
// not arrived waits on its client, not in the task: it is bounded by the
// message timeout (WithMessageTimeout), its deadline and the transport's
// limits, and takes no room from the requests that can run. A request
// that is never started needs no Done once Scheduled.
//
// Calling it is optional (without it, a request counts until Start, or
// until it has been pending four target delays); adapters call it first
// thing on the request's goroutine where that goroutine is not the one
// that called Arrive (the gRPC adapter: in its stats handler's TagRPC).
// It does nothing unless t is admitted and not yet started.
func (c *Controller) Scheduled(t *Ticket) {
	if t.state != ticketPending {
		return
	}
	c.prestart.remove(t.epoch, t.level)
	t.state = ticketScheduled
	if t.sampled {
		c.addDelay(c.now() - t.arrive)
	}
}

// addDelay counts a sampled request's delay before its goroutine ran
// (Scheduled) or, without Scheduled, before Start, under ArrivalDelay.
func (c *Controller) addDelay(d int64) {
	if c.sched == nil {
		c.delaySum.Add(max(d, 0))
		c.delayCount.Add(1)
	}
}

// release gives back an execution slot and hands free slots to waiters.
func (c *Controller) release() {
	c.hot.executing.Add(-1)
	if c.queued.Load() > 0 {
		c.mu.Lock()
		c.dispatch()
		c.mu.Unlock()
	}
}

// Degrade reports whether a request of level l should be served a degraded
// (cheaper) answer because the task is near its limit: the task is full
// (its occupancy has reached the pending cap, or requests wait for
// execution slots), or a signal is within 0.1 of the level's threshold. SRE book ch. 21: "a degraded response ... when its request to
// the DB Frontend failed"; here the handler can choose before it fails.
func (c *Controller) Degrade(l criticality.Level) bool {
	if !l.Valid() {
		l = criticality.Default
	}
	if c.queued.Load() > 0 || c.occupancy(c.now()) >= c.capFor(criticality.Sheddable) {
		c.obs.Degraded(l)
		return true
	}
	for i := range c.gates {
		g := &c.gates[i]
		if g.sig.Utilization() >= g.th.Start[l]-0.1 {
			c.obs.Degraded(l)
			return true
		}
	}
	return false
}

// Stats is a snapshot for metrics.
type Stats struct {
	Limit, Pending, Executing, Queued int64
	// Away is the running requests waiting on downstream calls (Away).
	Away int64
	// Stalled is the running requests waiting on their own clients
	// (Stall); they are not in Pending.
	Stalled int64
	// PendingCap is the current bound on pending requests (before
	// criticality headroom; fractional, see capFor).
	PendingCap float64
	// ServiceTime is the mean service time of the last interval.
	ServiceTime time.Duration
	// QueueDelay is the mean queueing delay of the last interval
	// (WithDelayMeasure).
	QueueDelay time.Duration
	// Saturated says whether the pending cap applies (WithSaturation).
	Saturated bool
	// NotStarted is, per criticality, the requests admitted whose
	// goroutine has not run (Scheduled) nor reached Start.
	NotStarted [criticality.NumLevels]int64
	// RetryShare is the share of retries among recent requests.
	RetryShare float64
	// Forced is, per criticality, the fraction of requests a ForceShed
	// drill rejects now (0: none).
	Forced [criticality.NumLevels]float64
	// Signals are the current utilizations, by signal name.
	Signals []SignalValue
}

// SignalValue is one signal's reading.
type SignalValue struct {
	Name        string
	Utilization float64
}

// Overloaded reports whether the Controller rejected a request for load
// within the last interval: the task is shedding. It is the overload
// signal quota enforcement uses to decide when soft limits apply
// (quota.WithOverload).
func (c *Controller) Overloaded() bool {
	return c.now()-c.lastShed.Load() < c.interval
}

// AttemptBuckets is the number of buckets of the attempt histogram: the
// attempt counter's values 0 (first attempt), 1 and 2 (the book's three
// attempts; a larger counter counts as 2).
const AttemptBuckets = 3

// Attempts returns the attempt histogram (SRE book ch. 21, Figure 21-1):
// per criticality and attempt counter, the requests that arrived since the
// Controller started, from the same samples as the window of it the
// don't-retry rule reads (the last DefaultHistoryWindow): under heavy
// traffic, when only one request in eight is sampled, each sampled request
// counts for eight.
func (c *Controller) Attempts() (h [criticality.NumLevels][AttemptBuckets]uint64) {
	for l := range h {
		for a := range h[l] {
			h[l][a] = c.attempted[l][a].Load()
		}
	}
	return h
}

// Stats returns a snapshot.
func (c *Controller) Stats() Stats {
	s := Stats{
		Limit: c.limit.Load(), Pending: c.occupancy(c.now()), Executing: c.hot.executing.Load(), Queued: c.queued.Load(), Away: c.away.Load(),
		Stalled:     c.stalled.Load(),
		PendingCap:  float64(c.pendingCap.Load()) / milli,
		ServiceTime: time.Duration(c.expectedSvc.Load()),
		QueueDelay:  time.Duration(c.lastDelay.Load()), Saturated: c.saturated.Load(),
	}
	now := c.now()
	for l := range s.NotStarted {
		s.NotStarted[l] = c.notStarted(criticality.Level(l))
		s.Forced[l] = c.forced(criticality.Level(l), now)
	}
	if w, _ := c.attempts.Sums(c.now()); w.A > 0 {
		s.RetryShare = w.B / w.A
	}
	for _, g := range c.gates {
		s.Signals = append(s.Signals, SignalValue{g.sig.Name(), g.sig.Utilization()})
	}
	return s
}

// maybeAdjust revisits the execution limit and the pending cap once per
// interval, on whichever request comes first.
func (c *Controller) maybeAdjust(now int64) {
	if now < c.nextAdjust.Load() || !c.adjust.TryLock() {
		return
	}
	defer c.adjust.Unlock()
	if now < c.nextAdjust.Load() {
		return
	}
	intervals := max(1, (now-c.nextAdjust.Load())/c.interval+1) // since the last adjustment
	c.nextAdjust.Store(now + c.interval)
	if c.saturation != nil {
		c.busy = c.saturation.Utilization()
		c.saturated.Store(c.busy >= saturatedAt)
	}
	c.adjustPending()
	n, sum := c.svcCount.Swap(0), c.svcSum.Swap(0)
	waited := c.waited.Swap(false)
	if n == 0 {
		// No measured request finished: no evidence of the service time.
		// The estimate halves with each such interval, so that a stale
		// one (requests held across a pause of the process) cannot
		// refuse every request for its deadline, and so measure nothing
		// new, for good.
		c.expectedSvc.Store(c.expectedSvc.Load() >> min(intervals, 62))
		return
	}
	mean := sum / n
	c.expectedSvc.Store(mean)
	if n >= sampleAbove {
		c.sampleMask.Store(sampleMaskHeavy)
	} else {
		c.sampleMask.Store(0)
	}
	limit := c.ls.limit
	c.ls = c.limits.step(c.ls, mean, waited)
	c.probeResume.Store(c.ls.resume)
	c.probingNow.Store(c.ls.probing)
	if next := c.ls.limit; next != limit {
		c.limit.Store(next)
		c.obs.LimitChanged(int(next))
		if next > limit {
			c.mu.Lock()
			c.dispatch()
			c.mu.Unlock()
		}
	}
}

// adjustPending revisits each criticality's usual occupancy and the
// pending cap. c.adjust is held.
func (c *Controller) adjustPending() {
	for l := range c.lv {
		c.lv[l].usual.Store(usualStep(c.lv[l].usual.Load(), c.levelOccupancy(criticality.Level(l))*1000))
	}
	hit := c.capHit.Swap(false)
	delay, ok := c.queueDelay()
	if !ok {
		return
	}
	c.lastDelay.Store(delay)
	c.pendingCap.Store(c.pending.step(c.pendingCap.Load(), delay, hit, c.busy))
}

// queueDelay is the interval's mean queueing delay, if it has a
// measurement: the scheduler's, or its sampled requests' from Arrive to
// Start.
func (c *Controller) queueDelay() (int64, bool) {
	if c.sched != nil {
		d, n := c.sched.read()
		return int64(d), n > 0
	}
	n, sum := c.delayCount.Swap(0), c.delaySum.Swap(0)
	if n == 0 {
		return 0, false
	}
	return sum / n, true
}

// RejectionOf reports whether err is a rejection made by a Controller, and
// its reason and kind. Adapters use it to answer with prebuilt responses.
func RejectionOf(err error) (r Reason, dontRetry, ok bool) {
	oe, isOutcome := err.(*outcome.Error)
	if !isOutcome || (oe.Kind != outcome.TaskOverloaded && oe.Kind != outcome.DontRetry) || oe.Local || oe.Downstream {
		return 0, false, false
	}
	for r := Reason(0); r < NumReasons; r++ {
		if oe.Reason == reasonNames[r] {
			return r, oe.Kind == outcome.DontRetry, true
		}
	}
	return 0, false, false
}
