package loadtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
)

// paceOnFake runs o on a fake clock that moves step at a time while the
// pacer waits, and returns what Run returned.
func paceOnFake(t *testing.T, o OpenLoop, step time.Duration, ctx context.Context, at func(int) (time.Duration, bool), fire func(int, time.Duration) func()) (Paced, *clock.Fake) {
	t.Helper()
	f := clock.NewFake(time.Unix(0, 0))
	o.Clock = f
	var p Paced
	stop := make(chan struct{})
	go func() { p = o.Run(ctx, at, fire); close(stop) }()
	for f.BlockUntil(1, stop) {
		f.Advance(step)
	}
	return p, f
}

// Each send leaves at its time, not before, whatever the calls before it
// are doing: a call that never returns until the end delays nothing.
func TestOpenLoopSendsOnSchedule(t *testing.T) {
	const n = 50
	release := make(chan struct{})
	var mu sync.Mutex
	sentAt := make([]time.Duration, 0, n)
	var start time.Time
	var f *clock.Fake
	fire := func(i int, lag time.Duration) func() {
		mu.Lock()
		sentAt = append(sentAt, f.Now().Sub(start))
		mu.Unlock()
		if lag != 0 {
			t.Errorf("send %d %v late on a clock that waits for it", i, lag)
		}
		return func() { <-release } // held: an open loop sends on regardless
	}
	f = clock.NewFake(time.Unix(0, 0))
	start = f.Now()
	o := OpenLoop{Clock: f}
	done := make(chan Paced)
	go func() { done <- o.Run(context.Background(), Every(100, n*10*time.Millisecond), fire) }()
	for i := 1; i <= n; i++ {
		f.BlockUntil(1, nil)
		f.Advance(10 * time.Millisecond)
	}
	close(release)
	p := <-done
	if p.Sent != n || p.Skipped != 0 || p.Late != 0 || p.Stopped {
		t.Fatalf("Run = %+v, want %d sent on time", p, n)
	}
	for i, at := range sentAt {
		if want := time.Duration(i) * 10 * time.Millisecond; at != want {
			t.Fatalf("send %d left at %v, want %v", i, at, want)
		}
	}
}

// Past MaxInFlight calls running, a send is skipped, counted and reported.
func TestOpenLoopBoundsCallsInFlight(t *testing.T) {
	release := make(chan struct{})
	var skipped []int // written by Skip, on the pacing goroutine
	o := OpenLoop{MaxInFlight: 3, Skip: func(i int, _ time.Duration) {
		skipped = append(skipped, i)
		if i == 9 {
			close(release) // the calls hold until the schedule is over
		}
	}}
	fire := func(i int, _ time.Duration) func() { return func() { <-release } }
	p, _ := paceOnFake(t, o, time.Millisecond, context.Background(), Every(1000, 10*time.Millisecond), fire)
	if p.Sent != 3 || p.Skipped != 7 {
		t.Fatalf("Run = %+v, want 3 sent and 7 skipped", p)
	}
	if len(skipped) != 7 || skipped[0] != 3 || skipped[6] != 9 {
		t.Fatalf("skipped %v, want 3 to 9", skipped)
	}
}

// A send made on the pacing goroutine that takes long makes the next
// ones late; a send is late past OpenLoop.Late (10 ms by default).
func TestOpenLoopCountsLateSends(t *testing.T) {
	var f *clock.Fake
	lags := map[int]time.Duration{}
	fire := func(i int, lag time.Duration) func() {
		lags[i] = lag
		if i == 1 {
			f.Advance(25 * time.Millisecond) // a send that blocks its pacer
		}
		return nil
	}
	f = clock.NewFake(time.Unix(0, 0))
	o := OpenLoop{Clock: f}
	var p Paced
	stop := make(chan struct{})
	go func() { p = o.Run(context.Background(), Every(100, 50*time.Millisecond), fire); close(stop) }()
	for f.BlockUntil(1, stop) {
		f.Advance(time.Millisecond)
	}
	if p.Sent != 5 || p.Late != 1 || p.MaxLag != 15*time.Millisecond {
		t.Fatalf("Run = %+v, want 5 sent, 1 late, the latest 15ms", p)
	}
	if lags[2] != 15*time.Millisecond || lags[3] != 5*time.Millisecond || lags[4] != 0 {
		t.Fatalf("lags %v, want send 2 15ms late, send 3 5ms, send 4 on time", lags)
	}
}

// A send Early ahead of its time leaves at once; ctx's end stops the
// schedule and says so.
func TestOpenLoopEarlyAndStop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	fire := func(i int, _ time.Duration) func() {
		if i == 3 {
			cancel()
		}
		return nil
	}
	p, f := paceOnFake(t, OpenLoop{Early: time.Second}, time.Millisecond, ctx, Every(10, 10*time.Second), fire)
	if !p.Stopped || p.Sent != 4 {
		t.Fatalf("Run = %+v, want 4 sent and stopped", p)
	}
	if !f.Now().Equal(time.Unix(0, 0)) {
		t.Fatalf("the clock moved to %v: sends within Early waited", f.Now())
	}
}
