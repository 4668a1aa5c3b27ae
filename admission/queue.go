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
	gone  bool // left the queue (timed out or cancelled); guarded by mu
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

// popHighest removes the oldest waiter of the highest criticality. c.mu is
// held.
func (c *Controller) popHighest() *waiter {
	for l := len(c.queues) - 1; l >= 0; l-- {
		if w := c.queues[l].pop(); w != nil {
			c.queued.Add(-1)
			return w
		}
	}
	return nil
}

// evictBelow makes room for a request of level l by displacing a less
// critical one, and reports whether it did. It first displaces the oldest
// waiter of the lowest criticality in the slot queue; failing that, it
// marks one not-yet-started request of the lowest criticality that has
// some as displaced: that request is refused when it reaches Start (on a
// busy CPU, admitted requests wait as runnable goroutines that no queue of
// ours holds, so they cannot be taken out before they run).
func (c *Controller) evictBelow(l criticality.Level) bool {
	if c.queued.Load() > 0 {
		c.mu.Lock()
		for low := criticality.Level(0); low < l; low++ {
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

// wait queues the request for an execution slot.
func (c *Controller) wait(ctx context.Context, t *Ticket) error {
	c.waited.Store(true)
	w := &waiter{ch: make(chan error, 1), level: t.level}
	c.mu.Lock()
	if c.queued.Load() >= c.queueCap(c.limit.Load()) {
		// Full: take the place of a less critical waiter, or give up.
		displaced := false
		for low := criticality.Level(0); low < t.level; low++ {
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
	c.queues[t.level].push(w)
	c.queued.Add(1)
	c.dispatch()
	c.mu.Unlock()

	wait := c.maxWait
	deadlineReason := false
	if d, ok := ctx.Deadline(); ok {
		if left := d.Sub(c.clock.Now()) - c.expectedService(); left < wait {
			wait, deadlineReason = max(left, 0), true
		}
	}
	timer := c.clock.NewTimer(wait)
	var err error
	select {
	case err = <-w.ch:
		timer.Stop()
		if err == nil {
			return c.started(t, true)
		}
		return err
	case <-timer.C():
	case <-ctx.Done():
		timer.Stop()
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
