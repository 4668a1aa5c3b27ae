package quota

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
)

// In ModePessimistic the shares of a limit held by the tasks never sum to
// more than 1, also while demand moves from one task to another: a task
// gets more only once the others have reported holding less.
func TestAllocatorPessimisticSharesNeverExceedOne(t *testing.T) {
	for _, mode := range []Mode{ModeOptimistic, ModePessimistic} {
		clk := clock.NewFake(time.Unix(0, 0))
		p, _ := New(Config{Tasks: 3, Customers: map[string]Limit{"a": {CPU: 3, Hard: true}}})
		a, err := NewAllocator(p, WithClock(clk), WithAllocatorMode(mode), WithLease(5*time.Second), WithRefresh(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		held := map[string]float64{} // what each task enforces now
		worst := 0.0
		refresh := func(task string, demand float64) {
			ls, err := a.Refresh(Report{Task: task, Customers: []CustomerUsage{{Customer: "a", Demand: demand, Share: held[task]}}})
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range ls.Grants {
				if g.Customer == "a" {
					held[task] = g.Share
				}
			}
			sum := 0.0
			for _, s := range held {
				sum += s
			}
			worst = max(worst, sum)
		}
		// Past learning mode, demand on x, then all of it moves to y.
		clk.Advance(6 * time.Second)
		for range 5 {
			for _, tk := range []string{"x", "y", "z"} {
				refresh(tk, map[string]float64{"x": 3}[tk])
			}
			clk.Advance(time.Second)
		}
		hx := held["x"]
		for range 5 {
			for _, tk := range []string{"y", "x", "z"} { // y asks before x gives back
				refresh(tk, map[string]float64{"y": 3}[tk])
			}
			clk.Advance(time.Second)
		}
		t.Logf("%v: x held %.3f, then y %.3f; worst sum of held shares %.3f", mode, hx, held["y"], worst)
		if hx < 0.9 || held["y"] < 0.9 {
			t.Errorf("%v: shares did not follow demand: x %.3f, then y %.3f", mode, hx, held["y"])
		}
		if mode == ModePessimistic && worst > 1+1e-9 {
			t.Errorf("pessimistic: held shares summed to %.4f", worst)
		}
		if mode == ModeOptimistic && worst <= 1 {
			t.Errorf("optimistic: held shares never summed over 1 (%.4f); the test shows nothing", worst)
		}
	}
}

// A task cannot claim the others' room by lying about the share it holds
// (issue 21, item 3): in pessimistic mode a reported share is believed up
// to what the Allocator last granted that task, and in learning mode
// (both modes) shares handed back are capped so that a claim of the whole
// limit takes only what the other tasks have not claimed, never their
// safe share.
func TestAllocatorBoundsClaimedShares(t *testing.T) {
	p, _ := New(Config{Tasks: 2, Customers: map[string]Limit{"a": {CPU: 4}}})
	grant := func(a *Allocator, task string, demand, claim float64) float64 {
		t.Helper()
		ls, err := a.Refresh(Report{Task: task, Customers: []CustomerUsage{{Customer: "a", Demand: demand, Share: claim}}})
		if err != nil {
			t.Fatal(err)
		}
		return shareOf(ls, "a")
	}
	// Pessimistic, past learning: x and y split a by demand, then x lies.
	clk := clock.NewFake(time.Unix(0, 0))
	a, err := NewAllocator(p, WithClock(clk), WithAllocatorMode(ModePessimistic), WithLease(5*time.Second), WithRefresh(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(6 * time.Second)
	var gx, gy float64
	for range 3 {
		gx = grant(a, "x", 1, gx)
		gy = grant(a, "y", 1, gy)
	}
	if gy < 0.4 {
		t.Fatalf("y's share %.3f with half the demand", gy)
	}
	grant(a, "x", 1, 1) // x claims it holds the whole limit
	if got := grant(a, "y", 1, gy); got < gy-1e-9 {
		t.Errorf("pessimistic: after x claimed a share of 1, y's share fell from %.3f to %.3f", gy, got)
	}
	// Learning mode, both modes: x claims the whole limit first, with a
	// quarter of it in demand. y's claim of half is justified by its
	// demand in ModePessimistic (which has no safe-share floor while
	// learning), by the floor in ModeOptimistic.
	for _, mode := range []Mode{ModeOptimistic, ModePessimistic} {
		a, err := NewAllocator(p, WithClock(clock.NewFake(time.Unix(0, 0))), WithAllocatorMode(mode))
		if err != nil {
			t.Fatal(err)
		}
		yDemand := map[Mode]float64{ModeOptimistic: 1, ModePessimistic: 2}[mode]
		x := grant(a, "x", 1, 1)
		y := grant(a, "y", yDemand, 0.5)
		if y < 0.5-1e-9 || x+y > a.learnCap()+0.5+1e-9 {
			t.Errorf("%v, learning: x claimed 1 and got %.3f, y claimed 0.5 and got %.3f", mode, x, y)
		}
		if x2 := grant(a, "x", 1, 1); x2 > a.learnCap()-y+1e-9 {
			t.Errorf("%v, learning: x claimed 1 again and got %.3f beside y's %.3f", mode, x2, y)
		}
	}
}

// The Allocator's memory is bounded by its customer entries over all live
// tasks, not by tasks times customers: a report that would pass the bound
// is refused, and a task forgotten after its lease gives its entries back.
func TestAllocatorBoundsEntries(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	p, _ := New(Config{Tasks: 2})
	a, err := NewAllocator(p, WithClock(clk), WithMaxEntries(MaxReportCustomers+5), WithLease(5*time.Second), WithRefresh(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	report := func(task string, n int) error {
		r := Report{Task: task}
		for i := range n {
			r.Customers = append(r.Customers, CustomerUsage{Customer: fmt.Sprintf("c%d", i), Demand: 1})
		}
		_, err := a.Refresh(r)
		return err
	}
	if err := report("big", MaxReportCustomers); err != nil {
		t.Fatal(err)
	}
	if err := report("small", 5); err != nil {
		t.Fatalf("within the bound: %v", err)
	}
	if err := report("third", 1); !errors.Is(err, ErrTooManyTasks) {
		t.Fatalf("past the bound: %v", err)
	}
	if err := report("big", 10); err != nil { // shrinking is always allowed
		t.Fatal(err)
	}
	if err := report("third", 1); err != nil {
		t.Fatalf("after big shrank: %v", err)
	}
	clk.Advance(6 * time.Second)
	report("small", 1) // big and third are forgotten
	if err := report("other", MaxReportCustomers); err != nil {
		t.Fatalf("after the others were forgotten: %v", err)
	}
	if _, err := NewAllocator(p, WithMaxEntries(10)); err == nil {
		t.Error("a bound below one report accepted")
	}
}

// A task restarted under its name (its first report holds no lease, and
// shows no demand yet) gets the share its predecessor's demand justified,
// not a floor: its customers' traffic is coming back to it. A report that
// does not say NoLease, or a new name, gets the floor as before. In
// pessimistic mode, where the draining predecessor may still enforce its
// lease, it gets the floor too.
func TestRestartedTaskInheritsItsDemand(t *testing.T) {
	for _, mode := range []Mode{ModeOptimistic, ModePessimistic} {
		clk := clock.NewFake(time.Unix(0, 0))
		p, _ := New(Config{Tasks: 3, Customers: map[string]Limit{"a": {CPU: 3}}})
		a, err := NewAllocator(p, WithClock(clk), WithAllocatorMode(mode), WithLease(5*time.Second), WithRefresh(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		held := map[string]float64{}
		share := func(r Report) float64 {
			ls, err := a.Refresh(r)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range ls.Grants {
				if g.Customer == "a" {
					held[r.Task] = g.Share
					return g.Share
				}
			}
			t.Fatalf("no grant for a: %+v", ls)
			return 0
		}
		clk.Advance(6 * time.Second) // past learning mode
		for range 3 {
			for _, tk := range []string{"x", "y", "z"} {
				share(Report{Task: tk, Customers: []CustomerUsage{{Customer: "a", Demand: 2, Share: held[tk]}}}) // over the limit: split by demand
			}
			clk.Advance(time.Second)
		}
		before := held["x"]
		restarted := share(Report{Task: "x", NoLease: true})
		// The same report without NoLease: the floor.
		floor := share(Report{Task: "x"})
		newcomer := share(Report{Task: "w", NoLease: true})
		t.Logf("%v: x held %.3f; restarted %.3f; without NoLease %.3f; a new name %.3f", mode, before, restarted, floor, newcomer)
		if mode == ModeOptimistic && restarted < 0.9*before {
			t.Errorf("%v: restarted task got %.3f, its predecessor held %.3f", mode, restarted, before)
		}
		if mode == ModePessimistic && restarted > 0.05 {
			t.Errorf("%v: restarted task got %.3f beside its predecessor's lease", mode, restarted)
		}
		if floor > 0.05 || newcomer > 0.05 {
			t.Errorf("%v: without a predecessor's demand: %.3f and %.3f, want the floor", mode, floor, newcomer)
		}
	}
}

// A customer under its limit gives each task its demand and an even part
// of the room left, so that a task where its demand has not shown yet (a
// restarted task, or one its traffic just moved to) can serve it; the
// shares still sum to 1.
func TestUnderLimitRoomIsSplitEvenly(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	p, _ := New(Config{Tasks: 3, Customers: map[string]Limit{"a": {CPU: 5}}})
	a, err := NewAllocator(p, WithClock(clk), WithLease(5*time.Second), WithRefresh(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(6 * time.Second)
	got := map[string]float64{}
	for range 2 {
		for tk, d := range map[string]float64{"x": 1, "y": 0.5, "z": 0} {
			ls, err := a.Refresh(Report{Task: tk, Customers: []CustomerUsage{{Customer: "a", Demand: d}}})
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range ls.Grants {
				if g.Customer == "a" {
					got[tk] = g.Share * g.CPU
				}
			}
		}
	}
	// Demand 1.5 of 5: each task gets its demand and 3.5/3.
	for tk, want := range map[string]float64{"x": 1 + 3.5/3, "y": 0.5 + 3.5/3, "z": 3.5 / 3} {
		if math.Abs(got[tk]-want) > 1e-9 {
			t.Errorf("%s: limit %.4f, want %.4f", tk, got[tk], want)
		}
	}
	if sum := got["x"] + got["y"] + got["z"]; math.Abs(sum-5) > 1e-9 {
		t.Errorf("limits sum to %.4f, want 5", sum)
	}
}
