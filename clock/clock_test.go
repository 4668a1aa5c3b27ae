package clock_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func fired(t clock.Timer) (time.Time, bool) {
	select {
	case v := <-t.C():
		return v, true
	default:
		return time.Time{}, false
	}
}

func TestFakeTimersFireInOrderAtTheirDeadlines(t *testing.T) {
	f := clock.NewFake(epoch)
	late := f.NewTimer(3 * time.Second)
	early := f.NewTimer(1 * time.Second)
	f.Advance(999 * time.Millisecond)
	if _, ok := fired(early); ok {
		t.Fatal("timer fired before its deadline")
	}
	f.Advance(time.Millisecond)
	if v, ok := fired(early); !ok || !v.Equal(epoch.Add(time.Second)) {
		t.Fatalf("early timer: fired=%v at %v, want at %v", ok, v, epoch.Add(time.Second))
	}
	if f.Pending() != 1 {
		t.Fatalf("Pending() = %d, want 1", f.Pending())
	}
	f.Advance(10 * time.Second)
	if v, ok := fired(late); !ok || !v.Equal(epoch.Add(3*time.Second)) {
		t.Fatalf("late timer: fired=%v at %v", ok, v)
	}
	if got := f.Now(); !got.Equal(epoch.Add(11 * time.Second)) {
		t.Fatalf("Now() = %v, want %v", got, epoch.Add(11*time.Second))
	}
}

func TestFakeStopAndReset(t *testing.T) {
	f := clock.NewFake(epoch)
	tm := f.NewTimer(time.Second)
	if !tm.Stop() {
		t.Fatal("Stop of a pending timer reported false")
	}
	if tm.Stop() {
		t.Fatal("second Stop reported true")
	}
	f.Advance(2 * time.Second)
	if _, ok := fired(tm); ok {
		t.Fatal("stopped timer fired")
	}
	if tm.Reset(time.Second) {
		t.Fatal("Reset of a stopped timer reported it pending")
	}
	f.Advance(time.Second)
	if _, ok := fired(tm); !ok {
		t.Fatal("reset timer did not fire")
	}
	now := f.NewTimer(0)
	if _, ok := fired(now); !ok {
		t.Fatal("zero-duration timer did not fire at once")
	}
	f.Advance(-time.Hour)
	if !f.Now().Equal(epoch.Add(3 * time.Second)) {
		t.Fatalf("negative Advance moved the clock to %v", f.Now())
	}
}

func TestOrReal(t *testing.T) {
	f := clock.NewFake(epoch)
	if clock.OrReal(f) != clock.Clock(f) {
		t.Fatal("OrReal replaced a non-nil clock")
	}
	before := time.Now()
	if got := clock.OrReal(nil).Now(); got.Before(before) {
		t.Fatal("OrReal(nil) is not the real clock")
	}
}

// AfterFunc on a Fake calls its func on the goroutine that moves the time
// to its deadline, once, unless stopped; Reset arms it again.
func TestFakeAfterFunc(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	calls := 0
	tm := clock.AfterFunc(f, 10*time.Millisecond, func() { calls++ })
	if tm.C() != nil {
		t.Fatal("an AfterFunc timer has a channel")
	}
	f.Advance(9 * time.Millisecond)
	if calls != 0 {
		t.Fatal("called before its deadline")
	}
	f.Advance(time.Millisecond)
	f.Advance(time.Second)
	if calls != 1 {
		t.Fatalf("called %d times, want 1", calls)
	}
	if tm.Reset(5*time.Millisecond) || !tm.Stop() || tm.Stop() {
		t.Fatal("Reset of a fired timer, or Stop, reports wrongly")
	}
	f.Advance(time.Second)
	if calls != 1 {
		t.Fatal("a stopped timer called its func")
	}
	tm.Reset(0) // due now: called at once
	if calls != 2 || f.Pending() != 0 {
		t.Fatalf("after Reset(0): %d calls, %d pending", calls, f.Pending())
	}
}

// AfterFunc on Real runs its func; on a Clock without timers of its own
// it returns one that never does.
func TestAfterFuncOnOtherClocks(t *testing.T) {
	done := make(chan struct{})
	clock.AfterFunc(clock.Real(), 0, func() { close(done) })
	<-done
	tm := clock.AfterFunc(nowOnly{}, 0, func() { t.Error("called") })
	if tm.Stop() || tm.Reset(0) || tm.C() != nil {
		t.Fatal("the idle timer reports a pending timer or has a channel")
	}
}

type nowOnly struct{}

func (nowOnly) Now() time.Time                     { return time.Unix(0, 0) }
func (nowOnly) NewTimer(time.Duration) clock.Timer { return nil }

// A timer set to a later time never runs another timer's func on the
// goroutine that sets it, as time.AfterFunc never does: code may Reset a
// timer under a lock that the funcs take. Here A and C are due at once;
// while Advance runs A's func, the test goroutine resets B to an hour
// later; C must wait for Advance, not run inside Reset.
func TestFakeResetRunsNoOtherTimersFunc(t *testing.T) {
	f := clock.NewFake(epoch)
	inA, releaseA := make(chan struct{}), make(chan struct{})
	var ranC atomic.Bool
	clock.AfterFunc(f, 10*time.Millisecond, func() { close(inA); <-releaseA })
	clock.AfterFunc(f, 10*time.Millisecond, func() { ranC.Store(true) })
	b := f.NewTimer(time.Hour)
	done := make(chan struct{})
	go func() { f.Advance(10 * time.Millisecond); close(done) }()
	<-inA
	b.Reset(time.Hour)
	clock.AfterFunc(f, time.Hour, func() {})
	if ranC.Load() {
		t.Fatal("Reset or AfterFunc ran a timer due at the same time on the caller's goroutine")
	}
	close(releaseA)
	<-done
	if !ranC.Load() {
		t.Fatal("Advance did not run the second timer due")
	}
}
