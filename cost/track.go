package cost

import (
	"context"
	"sync"
	"time"

	"github.com/triagehq/triage/internal/reqctx"
)

// Tracker follows one request's cost when more than one goroutine may
// touch it: the handler starts and stops it, and every outgoing call the
// handler makes (from any goroutine) marks the request as waiting while at
// least one is open (Wait/Resume), as does a response its own client
// does not read (Stall/Unstall). The server adapters keep one in the
// request's context (TrackerFrom), and triage's gRPC client interceptor
// and HTTP Transport mark their calls as waits, so a request is not
// charged for the time its downstreams take. A Tracker may also tell a
// Blocker (admission control, through intake) when the request starts and
// stops waiting. A nil *Tracker does nothing.
type Tracker struct {
	mu      sync.Mutex
	meter   *Meter
	also    Blocker
	req     Request
	waits   int32
	on      bool
	stalled bool
}

// A Blocker is told, under the Tracker's lock, when its request begins
// to wait on outgoing calls (Block) and when the last one ends (Unblock).
type Blocker interface {
	Block()
	Unblock()
}

// A Staller is a Blocker that is also told, under the Tracker's lock,
// when its request begins and ends waiting on its own client (Stall and
// Unstall) while it waits on no outgoing call.
type Staller interface {
	Blocker
	Stall()
	Unstall()
}

// Start begins measuring with m.
func (t *Tracker) Start(m *Meter) { t.StartWith(m, nil) }

// StartWith begins measuring with m (nil: no CPU measurement) and telling
// b (nil: nobody) about waits.
func (t *Tracker) StartWith(m *Meter, b Blocker) {
	t.mu.Lock()
	t.meter, t.also, t.waits, t.on, t.stalled = m, b, 0, true, false
	if m != nil {
		m.Begin(&t.req)
	}
	t.mu.Unlock()
}

// Wait marks the start of an outgoing call.
func (t *Tracker) Wait() {
	if t == nil {
		return
	}
	t.mu.Lock()
	if t.on {
		if t.waits == 0 {
			if t.meter != nil {
				t.meter.Block(&t.req)
			}
			if t.also != nil {
				t.unstallBlocker()
				t.also.Block()
			}
		}
		t.waits++
	}
	t.mu.Unlock()
}

// Resume marks the end of an outgoing call begun with Wait.
func (t *Tracker) Resume() {
	if t == nil {
		return
	}
	t.mu.Lock()
	if t.on && t.waits > 0 {
		if t.waits--; t.waits == 0 {
			if t.meter != nil && !t.stalled {
				t.meter.Unblock(&t.req)
			}
			if t.also != nil {
				t.also.Unblock()
				t.stallBlocker()
			}
		}
	}
	t.mu.Unlock()
}

// Stall marks the request as waiting on its own client: a response it
// sends blocks because the client does not read it. It is not charged
// for the wait, and a Staller is told (while no outgoing call is open,
// when it is told Block instead). Stall and Unstall are not counted: a
// second Stall does nothing.
func (t *Tracker) Stall() {
	if t == nil {
		return
	}
	t.mu.Lock()
	if t.on && !t.stalled {
		t.stalled = true
		if t.waits == 0 {
			if t.meter != nil {
				t.meter.Block(&t.req)
			}
			t.stallBlocker()
		}
	}
	t.mu.Unlock()
}

// Unstall ends a wait begun with Stall.
func (t *Tracker) Unstall() {
	if t == nil {
		return
	}
	t.mu.Lock()
	if t.on && t.stalled {
		if t.waits == 0 {
			t.unstallBlocker()
			if t.meter != nil {
				t.meter.Unblock(&t.req)
			}
		}
		t.stalled = false
	}
	t.mu.Unlock()
}

// stallBlocker tells a Staller that a stalled request waits on no
// outgoing call; t.mu is held.
func (t *Tracker) stallBlocker() {
	if s, ok := t.also.(Staller); ok && t.stalled {
		s.Stall()
	}
}

// unstallBlocker tells a Staller that a stalled request's wait on its
// client ends or gives way to an outgoing call's; t.mu is held.
func (t *Tracker) unstallBlocker() {
	if s, ok := t.also.(Staller); ok && t.stalled {
		s.Unstall()
	}
}

// Stop ends the measurement and returns the request's cost (0 without a
// Meter); later Waits and Resumes do nothing, and the Blocker is not told
// again.
func (t *Tracker) Stop() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.on {
		return 0
	}
	t.on = false
	if t.meter == nil {
		return 0
	}
	return t.meter.End(&t.req)
}

// NewContext returns a child of ctx carrying t.
func NewContext(ctx context.Context, t *Tracker) context.Context {
	return context.WithValue(ctx, reqctx.CostKey{}, t)
}

// TrackerFrom returns the request's Tracker, or nil.
func TrackerFrom(ctx context.Context) *Tracker {
	t, _ := ctx.Value(reqctx.CostKey{}).(*Tracker)
	return t
}
