package drill

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/loadreport"
)

// machine emulates a task's machine: Slots workers, each request holding
// one for Work. Busy time is integrated for utilization; the work the
// requests did is its CPU counter (slotTime). At most n requests run, so
// running holds at most n entries.
type machine struct {
	slots chan struct{}
	work  time.Duration
	n     int

	now      func() time.Time
	mu       sync.Mutex
	busy     int
	busyArea float64 // slot-seconds since lastRead
	lastAt   time.Time
	lastRead time.Time
	done     time.Duration // the work of the requests that ended
	running  []*flight
}

// flight is a request holding a slot: since when, and the work it does.
type flight struct {
	began time.Time
	work  time.Duration
}

// did is the work f has done by now: the time it has held its slot, but
// never more than its work.
func (f *flight) did(now time.Time) time.Duration { return max(0, min(now.Sub(f.began), f.work)) }

func newMachine(n int, work time.Duration) *machine {
	now := time.Now()
	return &machine{slots: make(chan struct{}, n), work: work, n: n, now: time.Now, lastAt: now, lastRead: now}
}

func (m *machine) account(delta int) {
	m.mu.Lock()
	now := m.now()
	m.busyArea += float64(m.busy) * now.Sub(m.lastAt).Seconds()
	m.busy += delta
	m.lastAt = now
	m.mu.Unlock()
}

// meter is the task's load report Meter: its utilization is the share of
// the slots the requests' work took over the Meter's window (its default,
// 10 s), the window its rates are counted over.
func (m *machine) meter(clk clock.Clock) (*loadreport.Meter, error) {
	return loadreport.New(loadreport.WithClock(clk), loadreport.WithCPUTime(m.slotTime, float64(m.n)))
}

// run holds a slot for d (waiting for one first, until ctx ends). It
// returns the request's CPU on this machine: how long it held the slot,
// but never more than d, the work it did. A process frozen meanwhile
// (SIGSTOP) or a host too busy to fire the timer on time holds the slot
// longer, and does no more work for it.
func (m *machine) run(ctx context.Context, d time.Duration) (time.Duration, error) {
	waiting := cost.TrackerFrom(ctx) // the wait for a slot is no work of the request's
	waiting.Wait()
	select {
	case m.slots <- struct{}{}:
		waiting.Resume()
	case <-ctx.Done():
		waiting.Resume()
		return 0, ctx.Err()
	}
	f := m.begin(d)
	defer func() { <-m.slots }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return m.end(f), nil
	case <-ctx.Done():
		return m.end(f), ctx.Err()
	}
}

// begin counts a request that took a slot to do work d.
func (m *machine) begin(d time.Duration) *flight {
	m.account(+1)
	m.mu.Lock()
	defer m.mu.Unlock()
	f := &flight{began: m.now(), work: d}
	m.running = append(m.running, f)
	return f
}

// end counts f's end and returns the work it did.
func (m *machine) end(f *flight) time.Duration {
	m.mu.Lock()
	did := f.did(m.now())
	m.done += did
	if i := slices.Index(m.running, f); i >= 0 {
		m.running = slices.Delete(m.running, i, i+1)
	}
	m.mu.Unlock()
	m.account(-1)
	return did
}

// slotTime is the machine's "CPU" (cost.WithCPU), which quotas charge:
// the work its requests have done since it started, those running
// included. A process frozen meanwhile (SIGSTOP) or a host too busy to
// fire a request's timer on time holds the slot longer and does no more
// work for it, as a real process's CPU time does not advance while it is
// stopped.
func (m *machine) slotTime() (time.Duration, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now, cpu := m.now(), m.done
	for _, f := range m.running {
		cpu += f.did(now)
	}
	return cpu, nil
}

// utilization returns the mean busy share of the slots since the last call.
func (m *machine) utilization() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	m.busyArea += float64(m.busy) * now.Sub(m.lastAt).Seconds()
	m.lastAt = now
	span := now.Sub(m.lastRead).Seconds()
	area := m.busyArea
	m.busyArea, m.lastRead = 0, now
	if span <= 0 {
		return 0
	}
	return area / span / float64(m.n)
}

// Name and Utilization make the machine an signals.Signal: its busy
// share now.
func (m *machine) Name() string         { return "machine" }
func (m *machine) Utilization() float64 { return m.current() }

// current is the instantaneous busy share: the saturation signal
// admission reads, and the degradation threshold.
func (m *machine) current() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return float64(m.busy) / float64(m.n)
}
