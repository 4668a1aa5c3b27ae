package quota

import (
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
