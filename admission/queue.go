package admission

import (
	"context"
	"time"

	"github.com/triagehq/triage/criticality"
)

// waiter is a request waiting for an execution slot. Its channel receives
// exactly one value: nil when it was given a slot, an error when it was
// displaced by a more critical request.
type waiter struct {
	ch    chan error
	level criticality.Level
	gone  bool // left the queue (timed out, cancelled, moved); guarded by mu
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

// fifo is one criticality's waiting requests, oldest first. Entries that
// left are skipped lazily.
type fifo struct {
	items []*waiter
	head  int
}

func (q *fifo) push(w *waiter) { q.items = append(q.items, w) }

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
			return w
		}
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

// popHighest removes the oldest waiter of the highest rank. c.mu is
// held.
func (c *Controller) popHighest() *waiter {
	for r := len(c.queues) - 1; r >= 0; r-- {
		if w := c.queues[r].pop(); w != nil {
			c.queued.Add(-1)
			return w
		}
	}
	return nil
}

// evictBelow makes room for a request of level l by displacing a less
// critical one, and reports whether it did. It first displaces the oldest
// waiter of the lowest rank in the slot queue (decayed requests first, see
// rank); failing that, it
// marks one not-yet-started request of the lowest criticality that has
// some as displaced: that request is refused when it reaches Start (on a
// busy CPU, admitted requests wait as runnable goroutines that no queue of
// ours holds, so they cannot be taken out before they run).
func (c *Controller) evictBelow(l criticality.Level) bool {
	if c.queued.Load() > 0 {
		c.mu.Lock()
		for low := 0; low < rank(l, false); low++ {
			if w := c.queues[low].pop(); w != nil {
				c.queued.Add(-1)
				w.ch <- c.reject(w.level, Concurrency, c.now())
				c.mu.Unlock()
				return true
			}
		}
		c.mu.Unlock()
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

// wait queues the request for an execution slot. A request whose
// criticality decays (criticality.WithDecay in ctx) moves, once it could
// no longer finish before the decay (the decay less the expected service
// time) while it waits, to the decayed queue of the level it fell to.
func (c *Controller) wait(ctx context.Context, t *Ticket) error {
	c.waited.Store(true)
	now := c.clock.Now()
	// A request decays once it could no longer finish before its decay:
	// the decay, less the expected service time, as with deadlines.
	dc, decays := criticality.DecayOf(ctx)
	if decays {
		dc.At = dc.At.Add(-c.expectedService())
	}
	stale := decays && !now.Before(dc.At)
	r := rank(t.level, stale && dc.To <= t.level)
	if stale && dc.To < t.level {
		r = rank(dc.To, true)
	}
	w := &waiter{ch: make(chan error, 1), level: t.level}
	capLimit := c.limit.Load()
	if c.probingNow.Load() {
		capLimit = max(capLimit, c.probeResume.Load()) // the queue a probe delays keeps its room
	}
	c.mu.Lock()
	if c.queued.Load() >= c.queueCap(capLimit) {
		// Full: take the place of a lower ranked waiter, or give up.
		displaced := false
		for low := 0; low < r; low++ {
			if v := c.queues[low].pop(); v != nil {
				c.queued.Add(-1)
				v.ch <- c.reject(v.level, Concurrency, c.now())
				displaced = true
				break
			}
		}
		if !displaced {
			c.mu.Unlock()
			return c.reject(t.level, Concurrency, c.now())
		}
	}
	c.queues[r].push(w)
	c.queued.Add(1)
	c.dispatch()
	c.mu.Unlock()

	wait := c.maxWait
	if c.probingNow.Load() {
		// The probe holds the limit at its minimum for one interval: it
		// delays requests, as BBR's ProbeRTT does, and sheds none for it.
		wait = max(wait, time.Duration(c.interval)+c.maxWait)
	}
	deadlineReason := false
	if d, ok := ctx.Deadline(); ok {
		if left := d.Sub(now) - c.expectedService(); left < wait {
			wait, deadlineReason = max(left, 0), true
		}
	}
	// Until the decay falls due, then the rest of the wait.
	first, rest := wait, time.Duration(0)
	if decays && !stale && dc.To < t.level {
		if until := dc.At.Sub(now); until < wait {
			first, rest = until, wait-until
		}
	}
	timer := c.clock.NewTimer(first)
	var err error
	for waiting := true; waiting; {
		select {
		case err = <-w.ch:
			timer.Stop()
			if err == nil {
				return c.started(t, true)
			}
			return err
		case <-timer.C():
			if rest == 0 {
				waiting = false
				break
			}
			c.mu.Lock()
			select {
			case err = <-w.ch: // given a slot or displaced just now
				c.mu.Unlock()
				if err == nil {
					return c.started(t, true)
				}
				return err
			default:
			}
			w.gone = true // move it behind every fresh request of its new level
			w = &waiter{ch: w.ch, level: t.level}
			c.queues[rank(dc.To, true)].push(w)
			c.mu.Unlock()
			timer, rest = c.clock.NewTimer(rest), 0
		case <-ctx.Done():
			timer.Stop()
			waiting = false
		}
	}
	c.mu.Lock()
	select {
	case err = <-w.ch: // given a slot or displaced just now
		c.mu.Unlock()
		if err == nil {
			c.release() // we give up the slot we were just given
		}
	default:
		w.gone = true
		c.queued.Add(-1)
		c.mu.Unlock()
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if deadlineReason {
		return c.reject(t.level, Deadline, c.now())
	}
	return c.reject(t.level, Concurrency, c.now())
}

func (c *Controller) expectedService() time.Duration { return time.Duration(c.expectedSvc.Load()) }
