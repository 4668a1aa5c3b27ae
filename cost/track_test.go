package cost

import (
	"reflect"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
)

// staller records what a Tracker tells it.
type staller struct{ told []string }

func (s *staller) Block()   { s.told = append(s.told, "block") }
func (s *staller) Unblock() { s.told = append(s.told, "unblock") }
func (s *staller) Stall()   { s.told = append(s.told, "stall") }
func (s *staller) Unstall() { s.told = append(s.told, "unstall") }

// A stall tells the Staller while no outgoing call is open; an outgoing
// call during a stall turns it into a wait on the call (Block) until the
// call ends, when the stall resumes; Stop ends it all.
func TestTrackerStallGivesWayToOutgoingCalls(t *testing.T) {
	var tr Tracker
	s := &staller{}
	tr.StartWith(nil, s)
	tr.Stall()
	tr.Stall() // not counted
	tr.Wait()  // an outgoing call from another goroutine
	tr.Wait()
	tr.Resume()
	tr.Resume() // last call ends: stalled again
	tr.Unstall()
	tr.Unstall()
	tr.Wait()
	tr.Stall() // while a call is open: nothing to tell
	tr.Unstall()
	tr.Resume()
	tr.Stall()
	tr.Stop()
	tr.Unstall() // after Stop: nothing
	want := []string{"stall", "unstall", "block", "unblock", "stall", "unstall", "block", "unblock", "stall"}
	if !reflect.DeepEqual(s.told, want) {
		t.Fatalf("told %v, want %v", s.told, want)
	}

	// A plain Blocker is told only of outgoing calls.
	b := &blockerOnly{}
	tr.StartWith(nil, b)
	tr.Stall()
	tr.Wait()
	tr.Resume()
	tr.Unstall()
	tr.Stop()
	if b.n != 2 {
		t.Fatalf("a Blocker was told %d times, want 2 (Block, Unblock)", b.n)
	}
	var nilTracker *Tracker
	nilTracker.Stall()
	nilTracker.Unstall()
}

type blockerOnly struct{ n int }

func (b *blockerOnly) Block()   { b.n++ }
func (b *blockerOnly) Unblock() { b.n++ }

// A request is not charged for the time its client does not read, nor
// twice when an outgoing call overlaps the stall: it costs what one
// waiting on an outgoing call for the same time costs, and less than one
// active throughout.
func TestTrackerDoesNotChargeAStall(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	cpu := &fakeCPU{clk: clk, start: clk.Now(), cores: 1}
	m, err := New(WithClock(clk), WithCPU(cpu.read))
	if err != nil {
		t.Fatal(err)
	}
	var stalled, waiting, active Tracker
	// Active 10 ms, then 300 ms stalled (an outgoing call open for 100 ms
	// of it) or waiting on a call, then active 10 ms.
	stalled.Start(m)
	waiting.Start(m)
	active.Start(m)
	clk.Advance(10 * time.Millisecond)
	stalled.Stall()
	waiting.Wait()
	clk.Advance(100 * time.Millisecond)
	stalled.Wait()
	clk.Advance(100 * time.Millisecond)
	stalled.Resume() // still stalled: not charged
	clk.Advance(100 * time.Millisecond)
	stalled.Unstall()
	waiting.Resume()
	clk.Advance(10 * time.Millisecond)
	s, w, a := stalled.Stop(), waiting.Stop(), active.Stop()
	if s != w || !(s < a/2) {
		t.Fatalf("cost stalled %v, waiting %v, active throughout %v: want stalled = waiting < active/2", s, w, a)
	}
}
