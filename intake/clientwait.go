package intake

import (
	"sync"
	"time"

	"github.com/triagehq/triage/clock"
)

// Own is the goroutine argument of ClientWait and ClientResume for the
// handler's own goroutine: the one that called Start.
const Own uint64 = 0

// maxWaiters is how many of a request's goroutines besides its own the
// Handle follows in their waits on the client; a request whose stream is
// used from more is never stalled.
const maxWaiters = 7

// clientWaits is what a Handle knows of its goroutines' waits on its own
// client: which goroutines have waited (its own, and the first maxWaiters
// others), which wait now, and whether the request is stalled.
type clientWaits struct {
	mu      sync.Mutex
	others  [maxWaiters]uint64 // the other goroutines seen, in order
	n       int                // how many of others are set; maxWaiters+1: too many
	waiting uint8              // bit 0: its own goroutine; bit i+1: others[i]
	own     uint8              // Own's waits under way: Own may wait twice at once (its writer's, from any goroutine)
	since   time.Time          // when every goroutine seen began to wait; zero: one works
	timer   clock.Timer
	stalled bool
	counted bool  // the stall counts against the connection's (Conn)
	ender   Ender // EndWith's
}

// bit returns the waiting bit of goroutine g, learning it if new; ok is
// false once more goroutines than the Handle follows have waited.
func (c *clientWaits) bit(g uint64) (b uint8, ok bool) {
	if g == Own {
		return 1, true
	}
	for i := 0; i < c.n && i < maxWaiters; i++ {
		if c.others[i] == g {
			return 2 << i, true
		}
	}
	if c.n >= maxWaiters {
		c.n = maxWaiters + 1
		return 0, false
	}
	c.others[c.n] = g
	c.n++
	return 2 << (c.n - 1), true
}

// idle reports whether every goroutine seen waits on the client, its own
// among them: only then may the request stall.
func (c *clientWaits) idle() bool {
	return c.n <= maxWaiters && c.waiting == uint8(1<<(c.n+1)-1)
}

// ClientWait tells admission control that goroutine g of the request,
// between Start and Finish, now waits on its own client: a send that may
// block on the client's flow control or socket, or a receive of the
// client's next message. g is Own for the handler's own goroutine, and
// for any other a number unique to it among the request's goroutines
// (the adapters use the runtime's goroutine id). Own's waits nest: it
// waits until as many ClientResume as ClientWait (a proxy's wait on its
// upstream that is a wait on the client, and its writer's flush from
// another goroutine, overlap).
//
// A request is stalled (admission.Controller.Stall: it gives its execution
// slot and its room back, and is not charged) once every goroutine of it
// that has waited on its client, its own among them, has been waiting
// for the controller's target delay (admission.Controller.TargetDelay),
// and while they all still wait; a goroutine that reads the client while
// another computes does not free the slot of a request that computes.
// A request whose client is used from more than eight goroutines is
// never stalled, and neither is one past its connection's bound
// (Conn) or the controller's (admission.WithMaxStalled):
// those keep their slot. Waits shorter than the target delay change
// nothing. It does nothing without admission control; the first call
// makes the request's timer (clock.AfterFunc), and later calls do not
// allocate.
func (h *Handle) ClientWait(g uint64) {
	x := h.x
	if x == nil || x.ctl == nil {
		return
	}
	c := &x.client
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.bit(g)
	if !ok {
		return
	}
	if g == Own && c.own < 255 {
		c.own++
	}
	c.waiting |= b
	if !c.idle() || !c.since.IsZero() {
		return
	}
	c.since = x.clk.Now()
	d := x.ctl.TargetDelay()
	if c.timer == nil {
		c.timer = clock.AfterFunc(x.clk, d, x.clientStalled)
	} else {
		c.timer.Reset(d)
	}
}

// ClientResume ends goroutine g's wait begun with ClientWait. If the
// request was stalled, it waits for an execution slot before it returns
// (admission.Controller.Unstall): ahead of every request not yet started,
// never past the limit, until the request's context ends.
func (h *Handle) ClientResume(g uint64) {
	x := h.x
	if x == nil || x.ctl == nil {
		return
	}
	c := &x.client
	c.mu.Lock()
	b, ok := c.bit(g)
	if !ok {
		c.mu.Unlock()
		return
	}
	if g == Own && c.own > 1 { // another of Own's waits goes on
		c.own--
		c.mu.Unlock()
		return
	}
	if g == Own {
		c.own = 0
	}
	c.waiting &^= b
	if !c.since.IsZero() {
		// Stopped: firing, it would start a goroutine to find nothing to stall.
		c.timer.Stop()
	}
	c.since = time.Time{}
	if c.stalled {
		// Under c.mu, so that the timer cannot stall the request again
		// before it has its slot.
		c.stalled = false
		x.cost.Unstall()
		if c.counted {
			c.counted = false
			x.conn.unstall()
		}
	}
	c.mu.Unlock()
}

// ClientDone ends goroutine g's wait begun with ClientWait, as
// ClientResume does, and tells the Handle that g is done with the client
// (a body read to its end, or to an error): g no longer counts among the
// goroutines whose waits decide whether the request stalls, so that a
// request whose body a proxy's transport read to the end stalls when its
// own goroutine then waits on a client that reads nothing. For Own it is
// ClientResume.
func (h *Handle) ClientDone(g uint64) {
	h.ClientResume(g)
	x := h.x
	if g == Own || x == nil || x.ctl == nil {
		return
	}
	c := &x.client
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.forget(g) || !c.idle() || !c.since.IsZero() || c.waiting == 0 {
		return
	}
	c.since = x.clk.Now()
	if c.timer == nil {
		c.timer = clock.AfterFunc(x.clk, x.ctl.TargetDelay(), x.clientStalled)
	} else {
		c.timer.Reset(x.ctl.TargetDelay())
	}
}

// forget removes goroutine g from those seen, reporting whether it was
// one of them.
func (c *clientWaits) forget(g uint64) bool {
	if c.n > maxWaiters {
		return false
	}
	for i := 0; i < c.n; i++ {
		if c.others[i] != g {
			continue
		}
		copy(c.others[i:], c.others[i+1:c.n])
		c.n--
		c.others[c.n] = 0
		low := c.waiting & (2<<i - 1) // its own bit and the others' before i
		c.waiting = low | c.waiting>>(i+2)<<(i+1)
		return true
	}
	return false
}

// clientStalled is the timer's: it stalls the request if every goroutine
// of it still waits on the client and has for the target delay (a timer
// of an earlier wait may fire late). Past its connection's or the task's
// bound on stalls, it ends the request's waits through its Ender instead,
// if the transport gave one (EndWith); without one the request keeps its
// slot.
func (x *admitted) clientStalled() {
	if x.tryStall() {
		return
	}
	if e := x.client.ender; e != nil {
		e.EndClientWaits()
	}
}

// tryStall stalls the request if it should; false if it should and may
// not.
func (x *admitted) tryStall() bool {
	c := &x.client
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stalled || c.since.IsZero() || !c.idle() || x.clk.Now().Sub(c.since) < x.ctl.TargetDelay() {
		return true
	}
	if !x.conn.stall() {
		return false
	}
	c.counted = true
	c.stalled = true
	x.overBound = false
	x.cost.Stall()
	return !x.overBound
}

// Ender ends a running request's waits on its client, so that its handler
// returns: the transport's (triagehttp sets the request's read and write
// deadlines in the past). EndClientWaits may be called from any
// goroutine, at most once a stall.
type Ender interface{ EndClientWaits() }

// EndWith gives the Handle what ends the request's waits on its client: a
// request that has waited on its client for the target delay when its
// connection or the task already holds as many stalled requests as it
// may (WithMaxConnStalls, admission.WithMaxStalled) is ended through e,
// rather than keep its execution slot while its client sends or reads
// nothing. Call it before the handler runs.
func (h *Handle) EndWith(e Ender) {
	if x := h.x; x != nil && x.ctl != nil {
		x.client.ender = e
	}
}

// endClientWaits stops the timer at Finish and gives back the
// connection's count of a request that ends stalled.
func (x *admitted) endClientWaits() {
	c := &x.client
	if c.timer == nil {
		return
	}
	c.timer.Stop()
	c.mu.Lock()
	if c.counted {
		c.counted = false
		x.conn.unstall()
	}
	c.since = time.Time{}
	c.mu.Unlock()
}
