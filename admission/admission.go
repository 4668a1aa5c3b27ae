// Package admission is backend admission control (SRE book ch. 21, the
// CRE post "Using load shedding to survive a success disaster"): a task
// provisioned for a rate keeps serving that rate, at low latency, however
// much more is thrown at it, shedding lower criticalities first.
//
// A Controller models one task's capacity. It sees each request at Arrive,
// as early as the transport allows, where it may refuse it cheaply
// (utilization signals, a bounded count of pending requests, the
// deadline); optionally at Scheduled, when the request's goroutine runs;
// at Start, where the request takes one of L execution slots or waits in a
// queue served highest criticality first; and at Done, which gives the
// slot back. Away and Back mark a running request's waits on other
// services, Stall and Unstall its waits on its own client: its slot serves
// others meanwhile. L and the pending cap are found from the service time
// and the queueing delay, not configured (pauses of the whole process,
// such as SIGSTOP, are left out of both). A refusal is an outcome error
// (RejectionOf): "task overloaded", or "overloaded; don't retry" when many
// recent requests are retries, with a RetryAfter once a sheddable class
// has been shed for a while.
//
// Create a Controller with New; the zero value is not usable. It is safe
// for concurrent use, and what it holds is bounded by its options (the
// queue by WithQueueFactor, stalls by WithMaxStalled), not by the load.
// Transports install it through package intake (triagegrpc, triagehttp
// WithAdmission). How it decides, and why: docs/admission.md.
package admission

import (
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/admission/limit"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/window"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/signals"
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
	// Queue: the request waited in Go's run queue, where the controller
	// cannot count it, while that queue's delay was over the target; such
	// requests are shed by criticality (RunQueued).
	Queue
	// NumReasons is the number of reasons.
	NumReasons
)

var reasonNames = [NumReasons]string{"concurrency", "utilization", "deadline", "late", "forced", "queue"}

// String returns the reason's metric name.
func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// Observer is told what a Controller decides, one Event at a time.
// Observe must be cheap and safe for concurrent use; triageprom and
// triageotel implement it.
type Observer interface {
	Observe(e Event)
}

// EventKind says what an Event reports.
type EventKind uint8

const (
	// Admitted: a request got an execution slot, after Event.Wait in the
	// queue (0: at once).
	Admitted EventKind = iota + 1
	// Rejected: a request was rejected for Event.Reason; Event.DontRetry
	// says the answer was "overloaded; don't retry".
	Rejected
	// LimitChanged: the controller set a new execution limit, Event.Limit.
	LimitChanged
	// Degraded: Degrade told a request to serve a degraded answer.
	Degraded
)

// Event is one of a Controller's decisions: about a request of Level,
// for every Kind but LimitChanged.
type Event struct {
	Kind      EventKind
	Level     criticality.Level
	Reason    Reason        // Rejected
	DontRetry bool          // Rejected
	Wait      time.Duration // Admitted
	Limit     int           // LimitChanged
}

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
	seeded  bool       // random was given: sampling draws from it too
	obs     []Observer // WithObserver
	gates   []gate
	maxWait time.Duration
	// waitServices bounds the wait in mean service times (0: off).
	waitServices float64
	// messageTimeout and lateAfter (ns) judge a request's lateness at
	// Start under SchedulerDelay; lateAfter 0 (ArrivalDelay): never late.
	messageTimeout, lateAfter int64
	// sched measures the queueing delay (SchedulerDelay); nil: sampled
	// requests measure it from Arrive to Start (ArrivalDelay).
	sched delaySource
	// gate sheds the arrivals the pending count cannot see (RunQueued).
	gate queueGate
	// runq reads the run queue's length for the gate (SchedulerDelay);
	// rq* count the interval's RunQueued arrivals, the run queue lengths
	// they found and how many of them were read; rqWait is the wait the
	// gate last read.
	runq                                    runnableSource
	rqArrivals, rqRunnable, rqReads, rqWait atomic.Int64
	rqLast                                  int64 // the run queue's length at the last adjustment
	// spareAt and spareN are runnableAt's last reading of the run
	// queue's length and when it was taken (Controller time).
	spareAt, spareN atomic.Int64
	gateEst         atomic.Int64
	// saturation says how busy the CPU is (work conservation); nil:
	// saturated always.
	saturation signals.Signal
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
	limits         limit.Rule
	ls             limit.State // guarded by adjust
	pausedSeen     int64       // paused at the last adjustment; guarded by adjust
	pauseMu        sync.Mutex  // serializes noting a pause
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
	measuredSvc atomic.Int64 // ns, the last measured mean service time, kept across intervals without one
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
	recent     atomic.Int64 // the clock as a recent sampled reading read it
	lastShed   atomic.Int64 // ns of a recent rejection (kept within interval/16)
	paused     atomic.Int64 // the total length of the pauses of the process seen so far (read)
	_          [40]byte
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
	probeSum   atomic.Int64 // of the requests started while probing
	probeCount atomic.Int64
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
		start:        clk.Now(),
		clock:        clk,
		random:       c.random,
		obs:          c.obs,
		gates:        c.gates,
		maxWait:      c.maxWait,
		waitServices: c.waitServices,
		targetDelay:  int64(c.targetDelay),
		interval:     int64(c.interval),
		tolerance:    c.tolerance,
		minLimit:     int64(c.minLimit),
		maxLimit:     int64(c.maxLimit),
		queueFactor:  int64(c.queueFactor),
		maxStalled:   int64(c.maxStalled),
		attempts:     window.New(int64(c.historyWindow/20), 20, 1),
	}
	ctl.since = clock.SinceFunc(clk, ctl.start)
	ctl.measureWith(&c)
	ctl.busy = 1
	if ctl.random == nil {
		ctl.random = rand.Float64
	} else {
		ctl.seeded = true
	}
	ctl.hot = new(hotLine)
	ctl.prestart.init(&ctl.hot.prestart, &ctl.lv)
	ctl.limit.Store(int64(c.initialLimit))
	ctl.pendingCap.Store(milli * (2*int64(c.initialLimit) + ctl.queueCap(int64(c.initialLimit))))
	ctl.nextAdjust.Store(int64(c.interval))
	ctl.lastShed.Store(math.MinInt64 / 2)
	ctl.limits = c.rule
	if ctl.limits == nil {
		ctl.limits = limit.Latency{Min: ctl.minLimit, Max: ctl.maxLimit, Tolerance: c.tolerance, ProbeEvery: probeEvery}
	}
	ctl.ls = limit.State{Limit: int64(c.initialLimit)}
	ctl.pending = pendingRule{target: ctl.targetDelay, floor: minPendingCap, ceiling: ctl.maxLimit * pendingPerLimit * milli, maxDelay: int64(c.maxWait)}
	ctl.buildErrs(c.retryAfterMin, c.retryAfterMax)
	return ctl, nil
}

// measureWith sets how the controller measures the queue it cannot see
// (the scheduler's delay, or the arrival's) and the CPU's saturation.
func (ctl *Controller) measureWith(c *config) {
	ctl.prestartEpoch = prestartEpoch
	if c.delay == SchedulerDelay || c.delay == 0 && c.clock == nil {
		sd := newSchedDelay()
		ctl.sched, ctl.runq = sd, sd
		ctl.prestartEpoch = int64(c.targetDelay)
		ctl.lateAfter = lateDelays * int64(c.targetDelay)
	}
	ctl.messageTimeout = int64(c.messageTimeout)
	if !c.saturationSet && c.clock == nil {
		if sig, err := (signals.CPUDemand{Interval: c.interval / 2}).Signal(); err == nil {
			c.saturation = sig
		}
	}
	ctl.saturation = c.saturation
	ctl.saturated.Store(true)
}

func (c *Controller) now() int64 { return int64(c.since()) }

// A gap between two readings of the clock longer than pauseAfter
// intervals, eight expected service times and minPause, in which nothing
// at all happened, counts as a pause of the process rather than requests
// taking long.
const (
	pauseAfter = 10
	minPause   = int64(time.Second)
)

// read is now for the readings that measure a sampled request (arrival,
// start, away, done); recent moves to it when it is more than every
// later (an arrival's reading is also the time of the unsampled arrivals
// after it, so arrivals pass 0; the others interval/16, which spares a
// shared write). A gap since recent that counts as a pause of the process
// (SIGSTOP, a frozen VM; pauseAfter) is added to paused, which the
// measurements leave out (pausedSince, steady).
func (c *Controller) read(every int64) int64 {
	now := c.now()
	switch gap := now - c.recent.Load(); {
	case gap > max(pauseAfter*c.interval, minPause):
		c.notePause(now)
	case gap > every:
		c.recent.Store(now)
	}
	return now
}

// readLater is read for the readings after a request's arrival.
func (c *Controller) readLater() int64 { return c.read(c.interval / 16) }

// steady is now less the pauses so far: the difference of two such
// times leaves out the pauses between them.
func (c *Controller) steady(now int64) int64 { return now - c.paused.Load() }

// notePause records the gap before now as a pause, once however many
// readings saw it: paused is added to before recent moves past the gap,
// so a reading that sees the new recent sees the pause too.
func (c *Controller) notePause(now int64) {
	c.pauseMu.Lock()
	defer c.pauseMu.Unlock()
	gap := now - c.recent.Load()
	if gap <= 0 {
		return
	}
	if gap > max(pauseAfter*c.interval, minPause, 8*c.expectedSvc.Load()) {
		c.paused.Add(gap)
	}
	c.recent.Store(now)
}

// pausedSince is the length of the pauses since mark (a reading of
// paused).
func (c *Controller) pausedSince(mark int64) int64 { return c.paused.Load() - mark }

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

// tell tells every Observer of e.
func (c *Controller) tell(e Event) {
	for _, o := range c.obs {
		o.Observe(e)
	}
}
