package usage

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
)

// A customer spending 0.5 CPU-seconds per second of CRITICAL and 0.25 of
// SHEDDABLE shows those rates once the window is full, and nothing a
// window after it stops.
func TestUsageRates(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	u, err := New(WithClock(clk), withWindow(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for range 2000 { // 20 s in 10 ms steps
		u.Add("gmail", criticality.Critical, 5*time.Millisecond)
		u.Add("gmail", criticality.Sheddable, 2500*time.Microsecond)
		u.Add("ads", criticality.CriticalPlus, time.Millisecond)
		clk.Advance(10 * time.Millisecond)
	}
	for _, tc := range []struct {
		c    string
		l    criticality.Level
		want float64
	}{{"gmail", criticality.Critical, 0.5}, {"gmail", criticality.Sheddable, 0.25}, {"gmail", criticality.SheddablePlus, 0}, {"ads", criticality.CriticalPlus, 0.1}, {"nobody", criticality.Critical, 0}} {
		if got := u.Rate(tc.c, tc.l); math.Abs(got-tc.want) > 0.02 {
			t.Errorf("%s/%v: %.3f, want %.3f", tc.c, tc.l, got, tc.want)
		}
	}
	if got := u.Total("gmail"); math.Abs(got-0.75) > 0.03 {
		t.Errorf("gmail total %.3f, want 0.75", got)
	}
	clk.Advance(11 * time.Second)
	if got := u.Total("gmail"); got != 0 {
		t.Errorf("a window after it stopped: %.3f", got)
	}
}

// A Table younger than its window reports rates over the time it has
// existed: a task restarted a second ago that spends 0.5 CPU-seconds per
// second reports 0.5, not an eighth of it (which made the quota service
// give a restarted task a sliver of each customer's limit).
func TestUsageRatesOfAYoungTask(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	u, err := New(WithClock(clk), withWindow(8*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for range 100 { // 1 s in 10 ms steps
		u.Add("gmail", criticality.Critical, 5*time.Millisecond)
		clk.Advance(10 * time.Millisecond)
	}
	if got := u.Rate("gmail", criticality.Critical); math.Abs(got-0.5) > 0.03 {
		t.Errorf("after 1 s: rate %.3f, want 0.5", got)
	}
	if got := u.All(); math.Abs(got-0.5) > 0.03 {
		t.Errorf("after 1 s: all %.3f, want 0.5", got)
	}
	snap := u.Snapshot()
	if len(snap) != 1 || math.Abs(snap[0].Demand-0.5) > 0.03 {
		t.Errorf("after 1 s: snapshot %+v, want demand 0.5", snap)
	}
}

// However many customers appear, at most MaxTracked (plus Other) are
// tracked; the excess is counted under Other, and idle customers make
// room.
func TestUsageIsBounded(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	u, _ := New(WithClock(clk), WithMaxTracked(10), withWindow(10*time.Second))
	for i := range 1000 {
		u.Add(fmt.Sprintf("c%d", i), criticality.Critical, time.Millisecond)
	}
	if n := u.Tracked(); n != 11 {
		t.Fatalf("%d tracked, want 10 plus Other", n)
	}
	if got := u.Rate(Other, criticality.Critical); got <= 0 {
		t.Fatal("the excess was not counted under Other")
	}
	clk.Advance(11 * time.Second) // all idle for a window
	u.Add("new", criticality.Critical, time.Millisecond)
	if n := u.Tracked(); n != 1 || u.Rate("new", criticality.Critical) <= 0 {
		t.Fatalf("after a window idle: %d tracked", n)
	}
	if _, err := New(WithMaxTracked(0)); err == nil {
		t.Error("no customer tracked")
	}
}
