package admission

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/criticality"
)

// waiter is a request waiting for an execution slot. Its channel receives
// exactly one value: nil when it was given a slot, an error when it was
// displaced by a more critical request.
type waiter struct {
	ch    chan error
	level criticality.Level
	in    *fifo // the queue it waits in
	gone  bool  // left the queue (timed out, cancelled, moved); guarded by mu
}

// leave marks w as gone from its queue. c.mu is held.
func (w *waiter) leave() {
	w.gone = true
	w.in.size.Add(-1)
	w.in.left++
	w.in.tidy()
}

// rank orders the waiting queues: for each level from the most critical
// down, the fresh requests, then those whose criticality has decayed to
// that level (criticality.WithDecay): a request past its usefulness ranks
// below every fresh request of the level it fell to, so it is the first
// shed and the last run.
func rank(l criticality.Level, stale bool) int {
	if stale {
		return 2 * int(l)
	}
	return 2*int(l) + 1
}

// returning is the rank of stalled requests coming back for a slot
// (Controller.Unstall): above every rank of new requests.
const returning = 2 * criticality.NumLevels

// fifo is one rank's waiting requests, oldest first. Entries that left
// are skipped lazily, and dropped once they are over half of it: it holds
// at most about twice the requests waiting in it, whichever end it is
// served from.
type fifo struct {
	items   []*waiter
	head    int
	left    int          // entries in items that left
	size    atomic.Int64 // requests waiting in it; read without c.mu
	emptied bool         // it was empty at some moment of this interval
	stands  atomic.Bool  // it was not, the whole last interval, and requests wait
}

func (q *fifo) push(w *waiter) {
	if q.size.Load() == 0 {
		q.emptied = true
	}
	w.in = q
	q.items = append(q.items, w)
	q.size.Add(1)
}

// roll ends an interval for q.
func (q *fifo) roll() {
	n := q.size.Load()
	q.stands.Store(!q.emptied && n > 0)
	q.emptied = n == 0
}

// tidy drops the entries that left, once they are over half of q.
func (q *fifo) tidy() {
	if q.left < 32 || 2*q.left < len(q.items)-q.head {
		return
	}
	n := 0
	for _, w := range q.items[q.head:] {
		if !w.gone {
			q.items[n] = w
			n++
		}
	}
	clear(q.items[n:])
	q.items, q.head, q.left = q.items[:n], 0, 0
}

// pop returns the oldest waiter still there, or nil.
func (q *fifo) pop() *waiter {
	for q.head < len(q.items) {
		w := q.items[q.head]
		q.items[q.head] = nil
		q.head++
		if q.head > 64 && q.head*2 > len(q.items) {
			n := copy(q.items, q.items[q.head:])
			q.items = q.items[:n]
			q.head = 0
		}
		if !w.gone {
			q.size.Add(-1)
			return w
		}
		q.left--
	}
	q.items, q.head = q.items[:0], 0
	return nil
}

// popNewest returns the newest waiter still there, or nil.
func (q *fifo) popNewest() *waiter {
	for n := len(q.items); n > q.head; n-- {
		w := q.items[n-1]
		q.items[n-1] = nil
		q.items = q.items[:n-1]
		if !w.gone {
			q.size.Add(-1)
			return w
		}
		q.left--
	}
	q.items, q.head = q.items[:0], 0
	return nil
}

// dispatch hands free execution slots to waiters, highest criticality
// first. c.mu is held.
func (c *Controller) dispatch() {
	for c.queued.Load() > 0 {
		if !c.tryAcquire() {
			return
		}
		w := c.popHighest()
		if w == nil {
			c.hot.executing.Add(-1)
			return
		}
		w.ch <- nil
	}
}

// popHighest removes the oldest waiter of the highest rank, or its
// newest where WithMaxWaitServiceTimes is set and that rank's queue
// stands (adaptive LIFO: the older ones give up at their bound either
// way, and the ones served have not waited it out; a level whose
// requests the slots keep up with is served in order). c.mu is held.
func (c *Controller) popHighest() *waiter {
	for r := len(c.queues) - 1; r >= 0; r-- {
		var w *waiter
		if c.waitServices > 0 && c.queues[r].stands.Load() {
			w = c.queues[r].popNewest()
		} else {
			w = c.queues[r].pop()
		}
		if w != nil {
			c.queued.Add(-1)
			return w
		}
	}
	return nil
}

// evictBelow makes room for a request of level l by displacing a less
// critical one, and reports whether it did. It first displaces the oldest
// waiter of the lowest rank in the slot queue (decayed requests first, see
// rank); failing that, it marks one not-yet-started request of the lowest
// criticality that has some as displaced: that request is refused when it
// reaches Start (on a busy CPU, admitted requests wait as runnable
// goroutines that no queue of ours holds, so they cannot be taken out
// before they run). A stale request (over its client's share) displaces
// only waiters ranked below the stale ones of its level.
func (c *Controller) evictBelow(l criticality.Level, stale bool) bool {
	if c.queued.Load() > 0 {
		c.mu.Lock()
		ok := c.displaceBelow(rank(l, stale))
		c.mu.Unlock()
		if ok {
			return true
		}
	}
	for low := criticality.Level(0); low < l; low++ {
		for {
			owed := c.lv[low].owed.Load()
			if c.notStarted(low)-owed <= 0 {
				break
			}
			if c.lv[low].owed.CompareAndSwap(owed, owed+1) {
				return true
			}
		}
	}
	return false
}

// displaceBelow refuses the oldest waiter of the lowest rank below r, and
// reports whether there was one. c.mu is held.
func (c *Controller) displaceBelow(r int) bool {
	for low := 0; low < r; low++ {
		if w := c.queues[low].pop(); w != nil {
			c.queued.Add(-1)
			w.ch <- c.reject(w.level, Concurrency, c.now())
			return true
		}
	}
	return false
}

// displaced reports whether a request of level l reaching Start must be
// refused to pay for an eviction, and takes the debt.
func (c *Controller) displaced(l criticality.Level) bool {
	for {
		owed := c.lv[l].owed.Load()
		if owed <= 0 {
			return false
		}
		if c.lv[l].owed.CompareAndSwap(owed, owed-1) {
			return true
		}
	}
}

// placement is where a waiting request queues, and when it moves.
type placement struct {
	rank int
	// decayIn > 0: the request's criticality falls to decayTo that long
	// from now (its decay, less the expected service time: after it, the
	// request could no longer finish before the decay), and it then moves
	// behind every fresh request of that level.
	decayIn time.Duration
	decayTo criticality.Level
}

// place ranks a request of level l arriving in the queue at now. A request
// whose decay has come (criticality.WithDecay in ctx) ranks with the
// decayed requests of the level it fell to; a late one (its message came
// late) with the decayed requests of its level.
func (c *Controller) place(ctx context.Context, l criticality.Level, now time.Time, late bool) placement {
	dc, decays := criticality.DecayOf(ctx)
	if !decays {
		return placement{rank: rank(l, late)}
	}
	at := dc.At.Add(-c.expectedService())
	switch {
	case now.Before(at) && dc.To < l:
		return placement{rank: rank(l, late), decayIn: at.Sub(now), decayTo: dc.To}
	case now.Before(at) || dc.To > l:
		return placement{rank: rank(l, late)}
	}
	return placement{rank: rank(min(dc.To, l), true)}
}

// enqueue puts w in the queue of rank r; a full queue makes room by
// refusing a lower ranked waiter, or refuses w.
func (c *Controller) enqueue(w *waiter, r int) error {
	capLimit := c.limit.Load()
	if c.probingNow.Load() {
		capLimit = max(capLimit, c.probeResume.Load()) // the queue a probe delays keeps its room
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.queued.Load() >= c.queueCap(capLimit) && !c.displaceBelow(r) {
		return c.reject(w.level, Concurrency, c.now())
	}
	c.queues[r].push(w)
	c.queued.Add(1)
	c.dispatch()
	return nil
}

// criticalWaits is how many times WithMaxWaitServiceTimes' bound a
// CRITICAL or CRITICAL_PLUS request may wait: where they are about all a
// task can serve, a wait of one service time refuses some that the next
// slots would have served.
const criticalWaits = 3

// waitBudget is how long a request of level l, waiting in q, may wait for
// a slot: the max wait, or WithMaxWaitServiceTimes' bound (serviceBound)
// when that is shorter and q stands (an interval more while the baseline probe
// holds the limit at its minimum: a probe delays requests, as BBR's
// ProbeRTT does, and sheds none for it), or less when its deadline leaves
// less time, less the expected service time; byDeadline says the deadline
// set it. Where q does not stand yet, check is when the request
// looks again (recheck): a burst that drains waits as long as it needs,
// one that stands is bounded from then on. The max wait is there so that
// a refused client retries elsewhere in time; when the refusal would say
// "overloaded; don't retry" (retriesHigh), nobody would, so a CRITICAL or
// CRITICAL_PLUS request with a deadline waits until the deadline leaves
// only the expected service time.
func (c *Controller) waitBudget(ctx context.Context, now time.Time, l criticality.Level, q *fifo) (budget time.Duration, byDeadline bool, check time.Duration) {
	budget = c.maxWait
	if c.waitServices > 0 {
		switch bound := c.serviceBound(l); {
		case bound > 0 && q.stands.Load():
			budget = min(budget, bound)
		case bound > 0:
			check = bound
		default:
			check = time.Duration(c.interval)
		}
	}
	if c.probingNow.Load() {
		budget += time.Duration(c.interval)
	}
	if d, ok := ctx.Deadline(); ok {
		left := d.Sub(now) - c.expectedService()
		if left < budget {
			return max(left, 0), true, check
		}
		if l >= criticality.Critical && c.retriesHigh(c.now()) {
			return left, true, 0
		}
	}
	return budget, false, check
}

// serviceBound is WithMaxWaitServiceTimes' bound on the wait of a level-l
// request, from the last measured service time (intervals without one,
// an idle spell's, keep it); 0 before one is measured.
func (c *Controller) serviceBound(l criticality.Level) time.Duration {
	n := c.waitServices
	if l >= criticality.Critical {
		n *= criticalWaits
	}
	return time.Duration(n * float64(c.measuredSvc.Load()))
}

// recheck looks again at a request waiting in q since since, at at:
// stands says q has stood a whole interval and the request has waited
// out serviceBound, so it gives up; otherwise next is when it looks again
// (at its bound, or an interval on while q does not stand).
func (c *Controller) recheck(at, since time.Time, l criticality.Level, q *fifo) (next time.Time, stands bool) {
	bound := c.serviceBound(l)
	if bound <= 0 || !q.stands.Load() {
		return at.Add(time.Duration(c.interval)), false
	}
	if at.Sub(since) >= bound {
		return time.Time{}, true
	}
	return since.Add(bound), false
}

// wait queues the request for an execution slot, within its wait budget;
// a late one ranks below the fresh requests of its level. A request whose
// criticality decays moves, once it could no longer
// finish before the decay, behind every fresh request of the level it
// fell to.
func (c *Controller) wait(ctx context.Context, t *Ticket, late bool) error {
	c.waited.Store(true)
	now := c.clock.Now()
	p := c.place(ctx, t.level, now, late)
	w := &waiter{ch: make(chan error, 1), level: t.level}
	if err := c.enqueue(w, p.rank); err != nil {
		return err
	}
	budget, byDeadline, check := c.waitBudget(ctx, now, t.level, w.in)
	end := now.Add(budget)
	var decayAt, checkAt time.Time // zero: none due
	if p.decayIn > 0 && p.decayIn < budget {
		decayAt = now.Add(p.decayIn)
	}
	if check > 0 && check < budget {
		checkAt = now.Add(check)
	}
	at := wakeAt(now, end, decayAt, checkAt) // when the timer is due
	timer := c.clock.NewTimer(at.Sub(now))
	for {
		select {
		case err := <-w.ch:
			timer.Stop()
			return c.answered(t, err, now)
		case <-timer.C():
			if !decayAt.IsZero() && !at.Before(decayAt) {
				var (
					err  error
					done bool
				)
				if w, err, done = c.demote(w, p.decayTo); done {
					return c.answered(t, err, now)
				}
				decayAt = time.Time{}
			}
			if !checkAt.IsZero() && !at.Before(checkAt) {
				next, stands := c.recheck(at, now, t.level, w.in)
				if stands {
					return c.giveUp(ctx, w, t.level, false)
				}
				if checkAt = next; !checkAt.Before(end) {
					checkAt = time.Time{}
				}
			}
			if !at.Before(end) {
				more, ok := c.waitOn(ctx, t.level, byDeadline)
				if !ok {
					break
				}
				end, byDeadline, checkAt = at.Add(more), true, time.Time{}
			}
			next := wakeAt(at, end, decayAt, checkAt)
			timer, at = c.clock.NewTimer(next.Sub(at)), next
			continue
		case <-ctx.Done():
			timer.Stop()
		}
		return c.giveUp(ctx, w, t.level, byDeadline)
	}
}

// wakeAt is the first of end and the times due (decay, check; zero:
// none), and not before now.
func wakeAt(now, end time.Time, due ...time.Time) time.Time {
	first := end
	for _, d := range due {
		if !d.IsZero() && d.Before(first) {
			first = d
		}
	}
	if first.Before(now) {
		return now
	}
	return first
}

// waitOn says whether a request whose maximum wait just ended waits on,
// and for how long: a CRITICAL or CRITICAL_PLUS request with a deadline
// does, until the deadline leaves only the expected service time, when
// its refusal would now say "don't retry" (the retries rose while it
// waited). Nobody would try it again elsewhere, which is what the maximum
// wait was for; waitBudget gives the same wait to one arriving now.
func (c *Controller) waitOn(ctx context.Context, l criticality.Level, byDeadline bool) (time.Duration, bool) {
	if byDeadline || l < criticality.Critical {
		return 0, false
	}
	d, ok := ctx.Deadline()
	if !ok || !c.retriesHigh(c.now()) {
		return 0, false
	}
	left := d.Sub(c.clock.Now()) - c.expectedService()
	return left, left > 0
}

// answered ends a wait that began at since and got its answer: a slot
// (nil) or a displacement.
func (c *Controller) answered(t *Ticket, err error, since time.Time) error {
	if err != nil {
		return err
	}
	return c.started(t, max(c.clock.Now().Sub(since), time.Nanosecond))
}

// received returns the answer w got, if it got one. c.mu is held: once
// it is, no answer can arrive.
func received(w *waiter) (error, bool) {
	select {
	case err := <-w.ch:
		return err, true
	default:
		return nil, false
	}
}

// demote moves w behind every fresh request of level to, unless it was
// answered meanwhile (done).
func (c *Controller) demote(w *waiter, to criticality.Level) (_ *waiter, err error, done bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err, ok := received(w); ok {
		return w, err, true
	}
	w.leave()
	moved := &waiter{ch: w.ch, level: w.level}
	c.queues[rank(to, true)].push(moved)
	return moved, nil, false
}

// leave takes w out of the queue, unless it was answered meanwhile: then
// it returns the answer.
func (c *Controller) leave(w *waiter) (err error, answered bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err, answered = received(w); !answered {
		w.leave()
		c.queued.Add(-1)
	}
	return err, answered
}

// awaitReturn queues a stalled request coming back for a slot, ahead of
// every rank of new requests and outside the queue's cap (the stalled
// requests are bounded by WithMaxStalled), and waits for the slot or
// ctx's end.
func (c *Controller) awaitReturn(ctx context.Context) error {
	w := &waiter{ch: make(chan error, 1), level: criticality.CriticalPlus}
	c.mu.Lock()
	c.queues[returning].push(w)
	c.queued.Add(1)
	c.dispatch()
	c.mu.Unlock()
	select {
	case <-w.ch: // a slot: nobody displaces a returning request
		return nil
	case <-ctx.Done():
	}
	if _, answered := c.leave(w); answered {
		return nil
	}
	return ctx.Err()
}

// giveUp takes w out of the queue when its wait ends (budget or context):
// a slot given to it just now goes back, a displacement just now is its
// answer, and otherwise the request is refused for its context, its
// deadline, or the lack of a slot.
func (c *Controller) giveUp(ctx context.Context, w *waiter, l criticality.Level, byDeadline bool) error {
	err, answered := c.leave(w)
	switch {
	case answered && err == nil:
		c.release() // we give up the slot we were just given
	case answered:
		return err // displaced just now; its rejection is counted
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if byDeadline {
		return c.reject(l, Deadline, c.now())
	}
	return c.reject(l, Concurrency, c.now())
}

func (c *Controller) expectedService() time.Duration { return time.Duration(c.expectedSvc.Load()) }
