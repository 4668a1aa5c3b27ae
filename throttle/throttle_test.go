package throttle_test

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/throttle"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// simulate offers `offered` requests per second of level l for d, against a
// backend that accepts at most `capacity` per second (per-second budget),
// and returns what the backend accepted and rejected from `from` on.
func simulate(t *testing.T, th *throttle.Throttle, l criticality.Level, start time.Time, d, from time.Duration, offered, capacity int) (accepted, rejected, local int) {
	t.Helper()
	step := time.Second / time.Duration(offered)
	used, sec := 0, int64(-1)
	for i := 0; time.Duration(i)*step < d; i++ {
		now := start.Add(time.Duration(i) * step)
		if s := now.Unix(); s != sec {
			sec, used = s, 0
		}
		measure := now.Sub(start) >= from
		if !th.AllowAt(l, now) {
			if measure {
				local++
			}
			continue
		}
		if used < capacity {
			used++
			th.AcceptedAt(l, now)
			if measure {
				accepted++
			}
		} else if measure {
			rejected++
		}
	}
	return
}

func seeded() func() float64 { return rand.New(rand.NewPCG(1, 2)).Float64 }

// The book: "Even in large overload situations, backends end up rejecting
// one request for each request they actually process" at K = 2; lower K
// (1.1) makes clients reject more locally.
func TestBackendRejectsAboutKMinusOnePerAccept(t *testing.T) {
	for _, tc := range []struct {
		k        float64
		min, max float64
	}{{2, 0.8, 1.2}, {1.1, 0.05, 0.15}} {
		th, err := throttle.New(throttle.WithK(tc.k), throttle.WithRandom(seeded()))
		if err != nil {
			t.Fatal(err)
		}
		const capacity = 100
		acc, rej, local := simulate(t, th, criticality.Critical, epoch, 6*time.Minute, 4*time.Minute, 10*capacity, capacity)
		ratio := float64(rej) / float64(acc)
		t.Logf("K=%v: backend accepted %d, rejected %d (%.3f per accept), %d rejected locally", tc.k, acc, rej, ratio, local)
		if ratio < tc.min || ratio > tc.max {
			t.Errorf("K=%v: rejected/accepted = %.3f, want in [%v, %v]", tc.k, ratio, tc.min, tc.max)
		}
		if acc < 2*60*capacity*95/100 {
			t.Errorf("K=%v: backend accepted %d in 2 min, below 95%% of its capacity", tc.k, acc)
		}
	}
}

func TestHealthyBackendNeverThrottled(t *testing.T) {
	th, _ := throttle.New(throttle.WithRandom(seeded()))
	_, rej, local := simulate(t, th, criticality.Sheddable, epoch, 3*time.Minute, 0, 500, 1000)
	if rej != 0 || local != 0 {
		t.Fatalf("rejected %d at the backend and %d locally under capacity", rej, local)
	}
}

func TestCriticalitiesAreSeparate(t *testing.T) {
	th, _ := throttle.New(throttle.WithRandom(seeded()))
	simulate(t, th, criticality.Sheddable, epoch, 3*time.Minute, 0, 1000, 100)
	now := epoch.Add(3 * time.Minute)
	if p := th.StatsAt(criticality.Sheddable, now).RejectProbability; p < 0.5 {
		t.Fatalf("overloaded SHEDDABLE reject probability %.2f", p)
	}
	if p := th.StatsAt(criticality.CriticalPlus, now).RejectProbability; p != 0 {
		t.Fatalf("CRITICAL_PLUS inherited SHEDDABLE's stats: p=%.2f", p)
	}
}

// The window slides: a burst ages out over one bucket width, never in one
// step, and is gone after window + one bucket.
func TestWindowAgesOutSmoothly(t *testing.T) {
	th, _ := throttle.New(throttle.WithWindow(2*time.Minute), throttle.WithBuckets(24)) // 5 s buckets
	for i := 0; i < 1000; i++ {
		th.AllowAt(criticality.Critical, epoch)
	}
	prev := th.StatsAt(criticality.Critical, epoch).Requests
	if prev != 1000 {
		t.Fatalf("Requests = %v", prev)
	}
	step := 100 * time.Millisecond
	maxDrop := 1000*float64(step)/float64(5*time.Second) + 1e-6
	for d := step; d <= 2*time.Minute+5*time.Second; d += step {
		cur := th.StatsAt(criticality.Critical, epoch.Add(d)).Requests
		if prev-cur > maxDrop {
			t.Fatalf("at +%v the count fell from %.1f to %.1f in one %v step (cliff)", d, prev, cur, step)
		}
		prev = cur
	}
	if prev != 0 {
		t.Fatalf("after window + a bucket, %v requests remain", prev)
	}
	if got := th.StatsAt(criticality.Critical, epoch.Add(time.Hour)).Requests; got != 0 {
		t.Fatalf("stale buckets counted: %v", got)
	}
}

func TestClockOption(t *testing.T) {
	f := clock.NewFake(epoch)
	th, _ := throttle.New(throttle.WithClock(f), throttle.WithRandom(func() float64 { return 0 }))
	if !th.Allow(criticality.Critical) {
		// nothing in the window: p = 0, even for a draw of 0
		t.Fatal("first request of a fresh throttle was rejected")
	}
	for i := 0; i < 99; i++ {
		th.Allow(criticality.Critical)
	}
	if th.Allow(criticality.Critical) {
		t.Fatal("100 requests and no accepts in the window, yet a draw of 0 passed")
	}
	th.Accepted(criticality.Critical)
	if s := th.StatsAt(criticality.Critical, f.Now()); s.Requests != 101 || s.Accepts != 1 {
		t.Fatalf("stats %+v", s)
	}
	f.Advance(3 * time.Minute)
	if !th.Allow(criticality.Critical) {
		t.Fatal("after the window, the throttle still rejects")
	}
}

func TestNewErrors(t *testing.T) {
	for _, opts := range [][]throttle.Option{
		{throttle.WithK(0.5)}, {throttle.WithK(-1)}, {throttle.WithWindow(time.Millisecond)},
		{throttle.WithBuckets(1)}, {throttle.WithBuckets(throttle.MaxBuckets + 1)},
	} {
		if _, err := throttle.New(opts...); !errors.Is(err, throttle.ErrConfig) {
			t.Errorf("New: err = %v", err)
		}
	}
}
