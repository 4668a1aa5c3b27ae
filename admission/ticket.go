package admission

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
)

// Ticket follows one request from Arrive to Done. Adapters keep it with
// the request (the gRPC adapter in the request's context node) and pass a
// pointer to Start and Done; the zero Ticket is not admitted.
type Ticket struct {
	arrive, started int64
	epoch           int64 // of the prestart ring it was counted in
	awayAt, awayFor int64 // sampled: the last Away, the time spent away before it (less pauses)
	mark            int64 // sampled: paused at Arrive, then at Start
	ready           int64 // Scheduled, under SchedulerDelay: when (Received)
	level           criticality.Level
	state           uint8
	sampled         bool    // measured: delay before Start, service time
	owes            bool    // displaced while not started: refused at Start (Scheduled)
	queued          bool    // Start gave it its slot after a wait in the queue
	arrival         Arrival // how it arrived: OverShare queues as late, Shadow never waits
	probe           bool    // sampled: started while the baseline probe ran
}

// Queued reports whether Start gave the request its execution slot after
// a wait in the queue (rather than at once).
func (t *Ticket) Queued() bool { return t.queued }

const (
	ticketPending   uint8 = iota + 1 // arrived, Start not called
	ticketScheduled                  // its goroutine ran (Scheduled), Start not called
	ticketInside                     // in Start: waiting, or rejected there
	ticketRunning                    // holds an execution slot
	ticketAway                       // running, waiting on a downstream call without a slot
	ticketStalled                    // running, waiting on its own client without a slot or room
	ticketDone
)

// Arrival says what a transport knows about how a request arrived.
type Arrival uint8

const (
	// OverShare: the request's client already holds its share of the
	// requests admitted and not yet running (to the gRPC adapter,
	// ConnShare streams of its connection waiting for their goroutines).
	// It is admitted only into the first half of the task's room, so that
	// one client's burst, which fills the room until its requests run,
	// leaves the other half to the other clients; if it queues for a
	// slot, it ranks below the fresh requests of its level, as a late one
	// does, so that another client's request arriving to a full queue
	// takes its place. A client alone still gets the whole task in time:
	// its requests wait less, and the pending cap grows.
	OverShare Arrival = 1 << iota
	// Shadow: the transport lets a rejected request through (package
	// shadow): its rejection is not told to the Observer, since nothing
	// was refused; the transport's shadow observer counts it. Its Start
	// never waits, and its rejections there are not told either.
	Shadow
	// RunQueued: the request waited in Go's run queue before Arrive, where
	// the controller could not count it (net/http reads a request and runs
	// its handler on one goroutine). While the queueing delay is over the
	// target, such requests are shed by criticality, lowest first, more
	// each interval until the delay meets the target (reason Queue).
	RunQueued
)

// Arrive decides whether a request of level l, carrying attempt counter
// attempt and the given deadline (zero: none), may enter the task. On
// admission it fills t and returns nil; the caller must then call Start (or
// Done, if the request ends before its handler runs) and Done. On rejection
// it returns an *outcome.Error of kind TaskOverloaded or DontRetry whose
// Reason is the Reason's name; the errors are shared and must not be
// modified. a says how the request arrived (zero: as a plain request).
// Arrive does not allocate.
func (c *Controller) Arrive(t *Ticket, l criticality.Level, attemptN int, deadline time.Time, a Arrival) error {
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
		now = c.read(0)
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
		return c.rejectAs(l, Forced, now, a)
	}
	if a&RunQueued != 0 {
		c.countRunQueued(sampled)
		if !c.gate.admit(l, c.backlogged(l, now)) && !c.processorSpare() {
			return c.rejectAs(l, Queue, now, a)
		}
	}
	for i := range c.gates {
		g := &c.gates[i]
		if p := g.th.rejectP(l, g.sig.Utilization()); p > 0 && (p >= 1 || c.random() < p) {
			return c.rejectAs(l, Utilization, now, a)
		}
	}
	if !deadline.IsZero() {
		left := int64(deadline.Sub(c.start)) - now
		if left <= c.expectedWaitAndService() && left <= c.expectedFor(l) {
			return c.rejectAs(l, Deadline, now, a)
		}
	}
	room := c.capFor(l)
	if a&OverShare != 0 {
		room = (room + 1) / 2
	}
	if c.occupancy(now)+c.reserved(l)+1 > room && !c.evictBelow(l, a&OverShare != 0) {
		c.capHit.Store(true)
		return c.rejectAs(l, Concurrency, now, a)
	}
	e, ok := c.prestart.add(now/c.prestartEpoch, l)
	if !ok {
		c.capHit.Store(true)
		return c.rejectAs(l, Concurrency, now, a)
	}
	*t = Ticket{arrive: now, epoch: e, level: l, state: ticketPending, sampled: sampled, arrival: a}
	if sampled {
		t.mark = c.paused.Load()
	}
	return nil
}

// processorSpare reports whether Go's run queues hold no more goroutines
// than there are processors, so that refusing a RunQueued arrival the
// gate would shed would leave a processor idle. The gate's budget is an
// estimate over an interval; this is the moment's fact, and the arrival
// is admitted as one the gate let through. (net/http starts a goroutine
// for each request it hands to a handler, so one a processor is the
// requests' own and no backlog.) The clock is read here, since an
// unsampled arrival's time is the last sampled one's.
func (c *Controller) processorSpare() bool {
	n, ok := c.runnableAt(c.now(), spareFresh)
	if !ok || n > int64(c.runq.procs()) {
		return false
	}
	c.gate.passed.Add(1)
	return true
}

// backlogged reports whether a RunQueued arrival of level l, at now,
// finds a backlog in Go's run queue over its level's bound
// (queueGate.backlogged), from a reading at most backlogFresh old. now
// is the arrival's time, which for an unsampled arrival is the last
// sampled one's: the admitted path reads no clock.
func (c *Controller) backlogged(l criticality.Level, now int64) bool {
	if c.gate.shedAt[l].Load() == 0 {
		return false
	}
	n, ok := c.runnableAt(now, backlogFresh)
	return ok && c.gate.backlogged(l, n, now, backlogConfirm(l, c.interval))
}

// runnableAt returns the goroutines in Go's run queues at now, from a
// reading less than fresh old: the reading takes the scheduler's lock, so
// arrivals within fresh of the last one reuse it.
func (c *Controller) runnableAt(now, fresh int64) (int64, bool) {
	if c.runq == nil {
		return 0, false
	}
	if now-c.spareAt.Load() < fresh {
		return c.spareN.Load(), true
	}
	r, ok := c.runq.runnable()
	if !ok {
		return 0, false
	}
	c.spareN.Store(int64(r))
	c.spareAt.Store(now)
	return int64(r), true
}

// spareFresh is how long runnableAt's reading of the run queue holds:
// less than one refusal's time through net/http (about 20 µs), so that on
// one processor every refusal reads afresh, and a server refusing on many
// processors takes the scheduler's lock for it at most 100,000 times a
// second.
const spareFresh = int64(10 * time.Microsecond)

// backlogFresh is how long a reading of the run queue holds for the
// moment's backlog: a bound of 25 ms and more needs no fresher one, and
// the admitted path then takes the scheduler's lock at most a thousand
// times a second.
const backlogFresh = int64(time.Millisecond)

// countRunQueued counts a RunQueued arrival and, for a sampled one, the
// run queue it found (the mean over the sampled arrivals is the gate's;
// under heavy traffic one in eight reads it).
func (c *Controller) countRunQueued(sampled bool) {
	c.rqArrivals.Add(1)
	if !sampled || c.runq == nil {
		return
	}
	if n, ok := c.runq.runnable(); ok {
		c.rqRunnable.Add(int64(n))
		c.rqReads.Add(1)
	}
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

// expectedWaitAndService is the time a request arriving now would take
// behind the whole queue: the recent wait before Start, the queue for
// slots divided among them, and one service time. It bounds expectedFor,
// which counts only the requests ahead.
func (c *Controller) expectedWaitAndService() int64 {
	svc := c.expectedSvc.Load()
	limit := c.limit.Load()
	return c.lastDelay.Load() + svc + c.queued.Load()*svc/limit
}

// expectedFor is expectedWaitAndService for a fresh level-l arrival, which
// waits behind the requests of its rank and those above it, not the whole
// queue (never more than expectedWaitAndService).
func (c *Controller) expectedFor(l criticality.Level) int64 {
	var ahead int64
	for r := rank(l, false); r < len(c.queues); r++ {
		ahead += c.queues[r].size.Load()
	}
	svc := c.expectedSvc.Load()
	return c.lastDelay.Load() + svc + ahead*svc/c.limit.Load()
}

// rejectAs is reject for a request that arrived as a says: a Shadow one's
// rejection is not told to the Observer. The task counts as shedding
// (Overloaded) either way, as it would under enforcement.
func (c *Controller) rejectAs(l criticality.Level, r Reason, now int64, a Arrival) error {
	if a&Shadow != 0 {
		c.noteShed(now)
		return c.errs[r][0][c.retrySlot(l, now)]
	}
	return c.reject(l, r, now)
}

func (c *Controller) noteShed(now int64) {
	if now-c.lastShed.Load() > c.interval/16 {
		c.lastShed.Store(now)
	}
}

func (c *Controller) reject(l criticality.Level, r Reason, now int64) error {
	c.noteShed(now)
	dr := 0
	if c.retriesHigh(now) {
		dr = 1
	}
	c.tell(Event{Kind: Rejected, Level: l, Reason: r, DontRetry: dr == 1})
	return c.errs[r][dr][c.retrySlot(l, now)]
}

// retriesHigh reports whether the share of retries among recent requests
// is at least the don't-retry ratio: rejections then say "overloaded;
// don't retry".
func (c *Controller) retriesHigh(now int64) bool {
	w, _ := c.attempts.Sums(now)
	return w.A >= dontRetryMinRequests/float64(c.sampleMask.Load()+1) && w.B >= DontRetryRatio*w.A
}

// Start gives the request an execution slot, waiting for one if needed (at
// most MaxWait, never past ctx's deadline, highest criticality first). It
// returns nil when the handler may run, or a rejection error (Concurrency,
// or Deadline when the deadline would pass while waiting) or ctx's error.
// Either way the caller calls Done afterwards.
//
// A request that arrived in shadow (Shadow) never waits: Start returns
// nil with a slot when one is free, the rejection it would have returned
// at once (displaced, Late, or Concurrency when the queue is full), or
// ErrWouldWait when the request would have queued for a slot; it then
// runs without one, still counted among the requests the task holds.
func (c *Controller) Start(ctx context.Context, t *Ticket) error {
	if t.arrival&Shadow != 0 {
		return c.startNow(t)
	}
	late, err := c.enter(t, 0)
	if err != nil {
		return err
	}
	if c.queued.Load() == 0 && c.tryAcquire() {
		return c.started(t, 0)
	}
	return c.wait(ctx, t, late)
}

// ErrWouldWait is Start's answer for a request in shadow (Shadow) that
// would have waited for an execution slot.
var ErrWouldWait = errors.New("admission: would wait for an execution slot")

// startNow is Start for a request in shadow.
func (c *Controller) startNow(t *Ticket) error {
	if _, err := c.enter(t, Shadow); err != nil {
		return err
	}
	if c.queued.Load() == 0 && c.tryAcquire() {
		return c.started(t, 0)
	}
	c.waited.Store(true)
	if c.queued.Load() >= c.queueCap(c.limit.Load()) {
		return c.rejectAs(t.level, Concurrency, c.now(), Shadow)
	}
	return ErrWouldWait
}

// enter moves an arrived request inside, for Start or startNow: it
// refuses one displaced by a more critical request or late past the
// message timeout, and says whether it is late.
func (c *Controller) enter(t *Ticket, a Arrival) (late bool, err error) {
	scheduled := t.state == ticketScheduled
	switch t.state {
	case ticketPending:
		c.prestart.remove(t.epoch, t.level)
		c.hot.started[t.level].Add(1)
	case ticketScheduled:
		c.hot.started[t.level].Add(1)
	default:
		return false, errors.New("admission: Start without Arrive")
	}
	t.state = ticketInside
	if scheduled && t.owes || !scheduled && c.displaced(t.level) {
		return false, c.rejectAs(t.level, Concurrency, c.now(), a)
	}
	if t.sampled {
		t.started = c.readLater()
		if !scheduled {
			c.addDelay(t.started - t.arrive - c.pausedSince(t.mark))
		}
		t.mark = c.paused.Load()
	}
	if c.lateAfter > 0 {
		now := t.started
		if !t.sampled {
			now = c.recent.Load()
		}
		if now-t.arrive > c.messageTimeout {
			return false, c.rejectAs(t.level, Late, now, a)
		}
		late = now-t.arrive > c.lateAfter
	}
	return late || t.arrival&OverShare != 0, nil
}

// started gives t its slot; waited is how long it queued for it (0: it
// did not).
func (c *Controller) started(t *Ticket, waited time.Duration) error {
	t.state = ticketRunning
	t.queued = waited > 0
	if t.sampled && t.queued {
		t.started = c.readLater() // service starts when the slot is given
		t.mark = c.paused.Load()
	}
	t.probe = t.sampled && c.probingNow.Load()
	c.tell(Event{Kind: Admitted, Level: t.level, Wait: waited})
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
			c.addService(t, c.readLater())
		}
		c.release()
		c.hot.started[t.level].Add(-1)
	case ticketAway, ticketStalled:
		w := c.elsewhere(t.state)
		if t.sampled {
			now := c.readLater()
			t.awayFor += c.steady(now) - t.awayAt
			c.addService(t, now)
		}
		w.count.Add(-1)
		if w.keepsRoom {
			c.hot.started[t.level].Add(-1)
		}
	case ticketInside:
		c.hot.started[t.level].Add(-1)
	case ticketPending:
		c.prestart.leave(t.epoch, t.level)
	case ticketScheduled:
	default:
		return
	}
	t.state = ticketDone
}

// addService counts a sampled request's service time: from Start to now,
// less its time away and the pauses of the process.
func (c *Controller) addService(t *Ticket, now int64) {
	d := max(now-t.started-t.awayFor-c.pausedSince(t.mark), 1)
	c.svcSum.Add(d)
	c.svcCount.Add(1)
	if t.probe {
		c.probeSum.Add(d)
		c.probeCount.Add(1)
	}
}

// Clock returns the Controller's clock (WithClock): a server built on
// the Controller (package intake) reads time from it.
func (c *Controller) Clock() clock.Clock { return c.clock }

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
// that is never started needs no Done once Scheduled. If its level owes
// a displacement (a more critical arrival took the room of one of its
// requests not yet started), this request pays it: its Start refuses it.
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
	t.owes = c.displaced(t.level) // it leaves the requests its level's debt is charged to
	if t.sampled {
		c.addDelay(c.readLater() - t.arrive - c.pausedSince(t.mark))
	}
	if c.lateAfter > 0 {
		t.ready = c.readLater()
	}
}

// Received tells c that the message of a request waiting on its client
// (Scheduled) has come, read by the transport itself (triagehttp's
// read-ahead of a body): the time the client took to send it was the
// client's, so Start judges the request's lateness (WithMessageTimeout)
// by the task's own delays only, before Scheduled and from now. Without
// it, that time counts. It does nothing unless t is Scheduled and not
// yet started.
func (c *Controller) Received(t *Ticket) {
	if t.state != ticketScheduled || t.ready == 0 {
		return
	}
	now := c.readLater()
	t.arrive += now - t.ready
	t.ready = now
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
