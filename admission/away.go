package admission

import (
	"context"
	"math"
	"sync/atomic"
)

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
func (c *Controller) Away(t *Ticket) { c.depart(t, ticketAway) }

// Back ends a wait begun with Away.
func (c *Controller) Back(t *Ticket) {
	if t.state != ticketAway {
		return
	}
	c.hot.executing.Add(1)
	c.rejoin(t)
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
func (c *Controller) Stall(t *Ticket) bool { return c.depart(t, ticketStalled) }

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
	c.rejoin(t)
	return nil
}

// A running request may wait elsewhere than in the task, its slot given
// to the next waiter and its time there not service time: away, on a call
// to another service (Away, Back), or stalled, on its own client (Stall,
// Unstall). The two differ only in what they keep and what bounds them.
type elsewhere struct {
	count     *atomic.Int64
	max       int64 // at most this many at once
	keepsRoom bool  // counted in the pending cap and its level's occupancy
}

func (c *Controller) elsewhere(s uint8) elsewhere {
	if s == ticketAway {
		return elsewhere{count: &c.away, max: math.MaxInt64, keepsRoom: true} // bounded by the slots and the room
	}
	return elsewhere{count: &c.stalled, max: c.maxStalled}
}

// depart moves a running request elsewhere (state s), within that
// place's bound; it reports whether it moved.
func (c *Controller) depart(t *Ticket, s uint8) bool {
	if t.state != ticketRunning {
		return false
	}
	w := c.elsewhere(s)
	for {
		n := w.count.Load()
		if n >= w.max {
			return false
		}
		if w.count.CompareAndSwap(n, n+1) {
			break
		}
	}
	t.state = s
	if t.sampled {
		t.awayAt = c.steady(c.readLater())
	}
	if !w.keepsRoom {
		c.hot.started[t.level].Add(-1)
	}
	c.release()
	return true
}

// rejoin ends a request's wait elsewhere; its slot was taken back (Back,
// Unstall).
func (c *Controller) rejoin(t *Ticket) {
	w := c.elsewhere(t.state)
	t.state = ticketRunning
	if t.sampled {
		t.awayFor += c.steady(c.readLater()) - t.awayAt
	}
	if !w.keepsRoom {
		c.hot.started[t.level].Add(1)
	}
	w.count.Add(-1)
}
