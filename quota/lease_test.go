package quota

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
)

func lease(fb Fallback) Lease {
	return Lease{
		Grants:  []Grant{{Customer: "ads", CPU: 3, ByCriticality: [4]float64{criticality.Sheddable: 1}, Share: 0.5}},
		Default: Grant{CPU: 1, Share: 0.25}, Duration: 10 * time.Second, Refresh: 2 * time.Second,
		Fallback: fb, Tasks: 3,
	}
}

// A lease gives limit × share until it expires, then the fallback; before
// any lease, the bootstrap policy's fallback or no limit.
func TestLeasedLimits(t *testing.T) {
	for _, tc := range []struct {
		fb                Fallback
		expired, expiredP float64 // ads CRITICAL, ads CRITICAL_PLUS after expiry
	}{{Safe, 1, 1}, {Optimistic, math.Inf(1), math.Inf(1)}, {Pessimistic, 0, 1}} {
		clk := clock.NewFake(time.Unix(0, 0))
		l := NewLeased(clk, nil)
		if v, _ := l.Limit("ads", criticality.Critical); !math.IsInf(v, 1) || !l.Expired() {
			t.Fatalf("before any lease: %v, want no limit", v)
		}
		if err := l.Set(lease(tc.fb)); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			customer string
			lv       criticality.Level
			want     float64
		}{{"ads", criticality.Critical, 1.5}, {"ads", criticality.Sheddable, 0.5}, {"someone", criticality.Critical, 0.25}} {
			if v, _ := l.Limit(c.customer, c.lv); math.Abs(v-c.want) > 1e-9 {
				t.Errorf("%s %v: %v, want %v", c.customer, c.lv, v, c.want)
			}
		}
		clk.Advance(10 * time.Second)
		if !l.Expired() {
			t.Fatal("not expired")
		}
		if age, ok := l.Age(); !ok || age != 10*time.Second {
			t.Errorf("age %v", age)
		}
		v, _ := l.Limit("ads", criticality.Critical)
		vp, _ := l.Limit("ads", criticality.CriticalPlus)
		if v != tc.expired || vp != tc.expiredP {
			t.Errorf("%s after expiry: CRITICAL %v, CRITICAL_PLUS %v; want %v, %v", tc.fb, v, vp, tc.expired, tc.expiredP)
		}
	}
	p, _ := New(Config{Customers: map[string]Limit{"ads": {CPU: 3}}, Tasks: 3, Fallback: Pessimistic})
	l := NewLeased(nil, p)
	if v, _ := l.Limit("ads", criticality.CriticalPlus); v != 1 {
		t.Errorf("bootstrap pessimistic CRITICAL_PLUS: %v, want the safe share 1", v)
	}
	if v, _ := l.Limit("ads", criticality.Critical); v != 0 {
		t.Errorf("bootstrap pessimistic CRITICAL: %v, want 0", v)
	}
}

// A malformed lease is refused and the last one stays.
func TestLeasedRefusesBadLeases(t *testing.T) {
	l := NewLeased(nil, nil)
	if err := l.Set(lease(Safe)); err != nil {
		t.Fatal(err)
	}
	bad := []func(*Lease){
		func(ls *Lease) { ls.Duration = 0 },
		func(ls *Lease) { ls.Refresh = time.Hour },
		func(ls *Lease) { ls.Tasks = 0 },
		func(ls *Lease) { ls.Fallback = "closed" },
		func(ls *Lease) { ls.Default.CPU = math.NaN() },
		func(ls *Lease) { ls.Grants[0].Share = 2 },
		func(ls *Lease) { ls.Grants[0].ByCriticality[0] = -1 },
		func(ls *Lease) { ls.Grants[0].Customer = "no spaces" },
	}
	for i, f := range bad {
		ls := lease(Safe)
		f(&ls)
		if err := l.Set(ls); err == nil {
			t.Errorf("bad lease %d accepted", i)
		}
	}
	if v, _ := l.Limit("ads", criticality.Critical); v != 1.5 {
		t.Errorf("the last good lease did not stay: %v", v)
	}
}

func report(task string, demand map[string]float64) Report {
	r := Report{Task: task}
	for c, d := range demand {
		r.Customers = append(r.Customers, CustomerUsage{Customer: c, Used: [4]float64{criticality.Critical: d / 2}, Demand: d})
	}
	return r
}

func shareOf(ls Lease, customer string) float64 {
	for _, g := range ls.Grants {
		if g.Customer == customer {
			return g.Share
		}
	}
	return ls.Default.Share
}

// Each customer's limit is split where its demand lands; a customer with
// no demand anywhere gets 1/N per task; tasks unheard of for a lease are
// forgotten.
func TestAllocatorSplitsByDemand(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	p, _ := New(Config{Customers: map[string]Limit{"ads": {CPU: 4}, "idle": {CPU: 1}}, Tasks: 3})
	a, err := NewAllocator(p, WithClock(clk), WithLease(10*time.Second), WithRefresh(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// Learning mode, the first lease: what the task holds, else 1/Tasks.
	held := report("t1", map[string]float64{"ads": 3})
	held.Customers[0].Share = 0.7
	if ls, _ := a.Refresh(held); shareOf(ls, "ads") != 0.7 || math.Abs(shareOf(ls, "idle")-1.0/3) > 1e-9 {
		t.Errorf("learning: shares %v, %v; want the held 0.7 and the safe 1/3", shareOf(ls, "ads"), shareOf(ls, "idle"))
	}
	clk.Advance(10 * time.Second)
	for _, task := range []string{"t1", "t2", "t3"} {
		if _, err := a.Refresh(report(task, nil)); err != nil {
			t.Fatal(err)
		}
	}
	a.Refresh(report("t1", map[string]float64{"ads": 3}))
	a.Refresh(report("t2", map[string]float64{"ads": 1}))
	l3, _ := a.Refresh(report("t3", nil))
	l1, _ := a.Refresh(report("t1", map[string]float64{"ads": 3}))
	// floor f = 0.05·4/3; two tasks with demand: shares (3+f)/(4+2f),
	// (1+f)/(4+2f), which add to 1, and f/(4+2f) for the third.
	f := 0.05 * 4 / 3
	if got, want := shareOf(l1, "ads"), (3+f)/(4+2*f); math.Abs(got-want) > 1e-9 {
		t.Errorf("t1 ads share %v, want %v", got, want)
	}
	if got, want := shareOf(l3, "ads"), f/(4+2*f); math.Abs(got-want) > 1e-9 {
		t.Errorf("t3 ads share %v, want %v", got, want)
	}
	if got := shareOf(l1, "idle"); math.Abs(got-1.0/3) > 1e-9 {
		t.Errorf("idle share %v, want 1/3", got)
	}
	if l1.Tasks != 3 || l1.Fallback != Safe || l1.Duration != 10*time.Second || l1.Refresh != 2*time.Second {
		t.Errorf("lease terms %+v", l1)
	}
	if err := l1.Validate(); err != nil {
		t.Error(err)
	}
	var gu GlobalUsage
	for _, g := range a.Usage() {
		if g.Customer == "ads" {
			gu = g
		}
	}
	if gu.Demand != 4 || gu.Used[criticality.Critical] != 2 || gu.Limit != 4 {
		t.Errorf("global usage %+v", gu)
	}
	// t2 and t3 fall silent for more than a lease while t1 keeps
	// refreshing (an Allocator silent for a lease learns again:
	// TestIdleAllocatorLearnsAgain).
	for range 6 {
		clk.Advance(2 * time.Second)
		l1, _ = a.Refresh(report("t1", map[string]float64{"ads": 3}))
	}
	if a.Tasks() != 1 {
		t.Fatalf("%d tasks after 12 s of the others' silence", a.Tasks())
	}
	if a.Tasks() != 1 || math.Abs(shareOf(l1, "ads")-1) > 1e-9 {
		t.Errorf("after the others went silent: %d tasks, share %v", a.Tasks(), shareOf(l1, "ads"))
	}
}

// Reports are validated, and the tasks known are bounded.
func TestAllocatorBounds(t *testing.T) {
	p, _ := New(Config{})
	a, _ := NewAllocator(p, WithMaxTasks(5))
	for i := range 5 {
		if _, err := a.Refresh(report(fmt.Sprintf("t%d", i), nil)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Refresh(report("t5", nil)); err != ErrTooManyTasks {
		t.Errorf("sixth task: %v", err)
	}
	for i, r := range []Report{
		{Task: ""},
		{Task: "t1", Customers: []CustomerUsage{{Customer: "a b"}}},
		{Task: "t1", Customers: []CustomerUsage{{Customer: "a"}, {Customer: "a"}}},
		{Task: "t1", Customers: []CustomerUsage{{Customer: "a", Demand: math.Inf(1)}}},
		{Task: "t1", Customers: []CustomerUsage{{Customer: "a", Used: [4]float64{-1}}}},
		{Task: "t1", Customers: []CustomerUsage{{Customer: "a", Share: 1.5}}},
	} {
		if _, err := a.Refresh(r); err == nil {
			t.Errorf("bad report %d accepted", i)
		}
	}
	for i, o := range [][]AllocatorOption{
		{WithLease(time.Second), WithRefresh(2 * time.Second)}, {WithRefresh(0)}, {WithMaxTasks(0)}, {WithLease(48 * time.Hour)},
	} {
		if _, err := NewAllocator(p, o...); err == nil {
			t.Errorf("bad options %d accepted", i)
		}
	}
	if _, err := NewAllocator(nil); err == nil {
		t.Error("no policy")
	}
}
