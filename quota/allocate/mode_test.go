package allocate

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/quota/usage"
)

// In quota.ModePessimistic the shares of a limit held by the tasks never sum to
// more than 1, also while demand moves from one task to another: a task
// gets more only once the others have reported holding less.
func TestAllocatorPessimisticSharesNeverExceedOne(t *testing.T) {
	for _, mode := range []quota.Mode{quota.ModeOptimistic, quota.ModePessimistic} {
		clk := clock.NewFake(time.Unix(0, 0))
		p, _ := quota.New(quota.Config{Tasks: 3, Customers: map[string]quota.Limit{"a": {CPU: 3, Hard: true}}})
		a, err := New(p, WithClock(clk), WithMode(mode), WithLease(5*time.Second), WithRefresh(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		held := map[string]float64{} // what each task enforces now
		worst := 0.0
		refresh := func(task string, demand float64) {
			ls, err := a.Refresh(quota.Report{Task: task, Customers: []usage.Customer{{Customer: "a", Demand: demand, Share: held[task]}}})
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
		if mode == quota.ModePessimistic && worst > 1+1e-9 {
			t.Errorf("pessimistic: held shares summed to %.4f", worst)
		}
		if mode == quota.ModeOptimistic && worst <= 1 {
			t.Errorf("optimistic: held shares never summed over 1 (%.4f); the test shows nothing", worst)
		}
	}
}

// A new leader's Allocator in quota.ModePessimistic hands out, while it learns,
// no share a task does not report holding (issue 24): tasks still enforce
// the old leader's grants until they report, so a task that claims nothing
// (a new task, or one whose lease ran out) gets 0, not the safe share,
// until the old grants have expired. The sum of the shares the tasks
// enforce, old and new, never passes 1 across the failover.
func TestPessimisticFailoverNeverOverGrants(t *testing.T) {
	p, _ := quota.New(quota.Config{Tasks: 4, Customers: map[string]quota.Limit{"a": {CPU: 4, Hard: true}}})
	clk := clock.NewFake(time.Unix(0, 0))
	const lease = 5 * time.Second
	newAlloc := func() *Allocator {
		a, err := New(p, WithClock(clk), WithMode(quota.ModePessimistic), WithLease(lease), WithRefresh(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	type hold struct {
		share   float64
		expires time.Time
	}
	held := map[string]hold{}
	worst := 0.0
	check := func() {
		sum := 0.0
		for _, h := range held {
			if clk.Now().Before(h.expires) {
				sum += h.share
			}
		}
		worst = max(worst, sum)
	}
	refresh := func(a *Allocator, task string, demand float64) float64 {
		t.Helper()
		claim := 0.0
		if h := held[task]; clk.Now().Before(h.expires) {
			claim = h.share
		}
		ls, err := a.Refresh(quota.Report{Task: task, Customers: []usage.Customer{{Customer: "a", Demand: demand, Share: claim}}, NoLease: claim == 0})
		if err != nil {
			t.Fatal(err)
		}
		held[task] = hold{shareOf(ls, "a"), clk.Now().Add(lease)}
		check()
		return held[task].share
	}
	old := newAlloc()
	clk.Advance(lease + time.Second)
	for range 4 {
		for _, tk := range []string{"x", "y", "z"} {
			refresh(old, tk, 1.3)
		}
		clk.Advance(time.Second)
	}
	before := worst
	// The old leader dies; the new one is elected a second later. w is new,
	// and x and y report before z does.
	clk.Advance(time.Second)
	next := newAlloc()
	gw := refresh(next, "w", 1)
	refresh(next, "x", 1.3)
	refresh(next, "y", 1.3)
	clk.Advance(time.Second)
	refresh(next, "z", 1.3)
	for range 8 { // through learning and past it
		clk.Advance(time.Second)
		for _, tk := range []string{"w", "x", "y", "z"} {
			refresh(next, tk, 1)
		}
	}
	t.Logf("held before the failover %.3f; w's first share %.3f; worst sum %.3f; w at the end %.3f", before, gw, worst, held["w"].share)
	if before < 0.95 {
		t.Fatalf("the old leader granted only %.3f in all; the test shows nothing", before)
	}
	if worst > 1+1e-9 {
		t.Errorf("the shares enforced across the failover summed to %.4f", worst)
	}
	if held["w"].share < 0.2 {
		t.Errorf("past learning w still holds %.3f of a limit its demand is a quarter of", held["w"].share)
	}
}

// A refresh costs work in proportion to its own report, not to every
// task's, also at the task bound (where a sweep on every refresh once
// recomputed the totals over every live task's report: 0.8 s of CPU a
// second for 1,000 tasks of 1,000 customers), and a task unheard of for a
// lease is forgotten by subtracting its report alone.
func TestRefreshWorkFollowsItsReport(t *testing.T) {
	const tasks, perTask = 50, 40
	p, _ := quota.New(quota.Config{Tasks: tasks})
	clk := clock.NewFake(time.Unix(0, 0))
	a, err := New(p, WithClock(clk), WithMaxTasks(tasks), WithLease(5*time.Second), WithRefresh(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	report := func(i int) quota.Report {
		r := quota.Report{Task: fmt.Sprintf("t%d", i)}
		for j := range perTask {
			r.Customers = append(r.Customers, usage.Customer{Customer: fmt.Sprintf("c%d", (i+j)%100), Demand: 0.01})
		}
		return r
	}
	for i := range tasks { // at the bound
		if _, err := a.Refresh(report(i)); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 3 {
		clk.Advance(400 * time.Millisecond) // a sweep falls due every few refreshes
		for i := range tasks {
			before := a.accounted
			if _, err := a.Refresh(report(i)); err != nil {
				t.Fatal(err)
			}
			if got := a.accounted - before; got > 2*perTask {
				t.Fatalf("round %d, task %d: a refresh of %d customers accounted %d entries", round, i, perTask, got)
			}
		}
	}
	// All but one task go quiet for a lease: they are forgotten, each by
	// its own report, and the totals are those of the one left.
	const refreshes = 6
	before := a.accounted
	for range refreshes {
		clk.Advance(time.Second)
		if _, err := a.Refresh(report(0)); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := a.accounted-before, uint64((tasks-1)*perTask+refreshes*2*perTask); got > want {
		t.Errorf("forgetting %d tasks accounted %d entries, want at most %d", tasks-1, got, want)
	}
	if a.Tasks() != 1 {
		t.Fatalf("%d tasks live, want 1", a.Tasks())
	}
	for _, g := range a.Usage() {
		if math.Abs(g.Demand-0.01) > 1e-9 {
			t.Errorf("customer %s: demand %.6f after the others were forgotten, want 0.01", g.Customer, g.Demand)
		}
	}
	if n := len(a.Usage()); n != perTask {
		t.Errorf("%d customers with usage, want %d", n, perTask)
	}
}

// An Allocator told that no earlier one's grant can be in force
// (WithFreshStart: the first leader a replicated service ever had) hands a
// task that holds nothing the safe share while it learns, in
// quota.ModePessimistic too, and the shares it hands out still never sum past 1;
// without it, such a task gets nothing for a lease.
func TestFreshStartGivesTheSafeShare(t *testing.T) {
	p, _ := quota.New(quota.Config{Tasks: 3, Customers: map[string]quota.Limit{"a": {CPU: 3, Hard: true}}})
	for _, fresh := range []bool{false, true} {
		opts := []Option{WithClock(clock.NewFake(time.Unix(0, 0))), WithMode(quota.ModePessimistic)}
		if fresh {
			opts = append(opts, WithFreshStart())
		}
		a, err := New(p, opts...)
		if err != nil {
			t.Fatal(err)
		}
		sum := 0.0
		var first float64
		for i, task := range []string{"x", "y", "z", "w"} {
			ls, err := a.Refresh(quota.Report{Task: task, NoLease: true, Customers: []usage.Customer{{Customer: "a", Demand: 1}}})
			if err != nil {
				t.Fatal(err)
			}
			s := shareOf(ls, "a")
			if i == 0 {
				first = s
			}
			sum += s
		}
		want := 0.0
		if fresh {
			want = 1.0 / 3
		}
		if math.Abs(first-want) > 1e-9 {
			t.Errorf("fresh %v: a task holding nothing got %.3f while learning, want %.3f", fresh, first, want)
		}
		if sum > 1+1e-9 {
			t.Errorf("fresh %v: four tasks were handed %.4f of the limit", fresh, sum)
		}
	}
}

// An Allocator that heard from no task for a whole lease (its service was
// cut off: every grant it made has expired) learns again as at a fresh
// start, instead of splitting a limit among the first tasks back as if they
// were all there is (before: the first task back got the whole of a
// customer without demand, 1 + 1/2 + 1/3 of it over three tasks).
func TestIdleAllocatorLearnsAgain(t *testing.T) {
	p, _ := quota.New(quota.Config{Tasks: 3, Customers: map[string]quota.Limit{"a": {CPU: 3}, "idle": {CPU: 3}}})
	for _, mode := range []quota.Mode{quota.ModeOptimistic, quota.ModePessimistic} {
		clk := clock.NewFake(time.Unix(0, 0))
		a, err := New(p, WithClock(clk), WithMode(mode), WithLease(5*time.Second), WithRefresh(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		held := map[string]float64{}
		round := func() float64 {
			sum := 0.0
			for _, task := range []string{"x", "y", "z"} {
				ls, err := a.Refresh(quota.Report{Task: task, Customers: []usage.Customer{{Customer: "a", Demand: 1, Share: held[task]}}})
				if err != nil {
					t.Fatal(err)
				}
				held[task] = shareOf(ls, "a")
				sum += shareOf(ls, "idle")
			}
			return sum
		}
		for range 8 {
			round()
			clk.Advance(time.Second)
		}
		clk.Advance(7 * time.Second) // no refresh for more than a lease
		clear(held)                  // the tasks' leases ran out
		if sum := round(); sum > 1.05+1e-9 {
			t.Errorf("%v: after a lease without refreshes, the tasks were handed %.3f of a customer without demand", mode, sum)
		}
		if held["x"] < 1.0/3-1e-9 {
			t.Errorf("%v: the first task back got %.3f of a, want at least the safe share", mode, held["x"])
		}
	}
}

// When every task falls silent for a whole lease at once (the drill's
// storm freezes a whole tier for a lease; a partition cuts the quota
// service off), the tasks come back with their leases expired and, for
// their first report, a demand their usage window averaged over the
// silence. In quota.ModeOptimistic the Allocator keeps the tasks it knew
// and splits by the demand they showed before it: before, it forgot them
// and learned again, handing each task the safe share, 1/Tasks, for a whole
// lease, so that the task that carries most of a customer refused it while
// the others held room they could not use.
func TestSilentTierGetsItsSharesBack(t *testing.T) {
	p, _ := quota.New(quota.Config{Tasks: 3, Customers: map[string]quota.Limit{"a": {CPU: 5}, "idle": {CPU: 3}}})
	demand := map[string]float64{"x": 2.4, "y": 2.0, "z": 0.6} // at the limit
	for _, mode := range []quota.Mode{quota.ModeOptimistic, quota.ModePessimistic} {
		clk := clock.NewFake(time.Unix(0, 0))
		a, err := New(p, WithClock(clk), WithMode(mode), WithLease(5*time.Second), WithRefresh(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		held := map[string]float64{}
		round := func(scale float64) (idle float64) {
			for _, task := range []string{"x", "y", "z"} {
				ls, err := a.Refresh(quota.Report{Task: task, Customers: []usage.Customer{{Customer: "a", Demand: scale * demand[task], Share: held[task]}}})
				if err != nil {
					t.Fatal(err)
				}
				held[task] = shareOf(ls, "a")
				idle += shareOf(ls, "idle")
			}
			return idle
		}
		for range 8 {
			round(1)
			clk.Advance(time.Second)
		}
		before := map[string]float64{"x": held["x"], "y": held["y"], "z": held["z"]}
		clk.Advance(6 * time.Second) // all silent past the lease
		clear(held)                  // their leases ran out
		if n, u := a.Tasks(), a.Usage(); n != 0 || len(u) != 0 {
			t.Errorf("%v: silent for a lease, yet %d live tasks and usage %v", mode, n, u)
		}
		// Their usage windows (4 s) cover mostly the silence.
		idle := round(0.2)
		t.Logf("%v: shares before %.3f %.3f %.3f; after the silence %.3f %.3f %.3f; idle customer %.3f in all",
			mode, before["x"], before["y"], before["z"], held["x"], held["y"], held["z"], idle)
		if idle > 1.05+1e-9 {
			t.Errorf("%v: the tasks were handed %.3f of a customer without demand", mode, idle)
		}
		sum := held["x"] + held["y"] + held["z"]
		if mode == quota.ModePessimistic {
			if sum > 1+1e-9 {
				t.Errorf("pessimistic: shares summed to %.4f after the silence", sum)
			}
			continue
		}
		for _, task := range []string{"x", "y", "z"} {
			if held[task] < 0.9*before[task] {
				t.Errorf("%v: after the silence %s got %.3f of a, it held %.3f before", mode, task, held[task], before[task])
			}
		}
		if sum > 1.05+1e-9 {
			t.Errorf("%v: shares summed to %.4f after the silence", mode, sum)
		}
		// z does not come back: it is forgotten a lease after the others
		// did.
		for range 6 {
			clk.Advance(time.Second)
			for _, task := range []string{"x", "y"} {
				if _, err := a.Refresh(quota.Report{Task: task, Customers: []usage.Customer{{Customer: "a", Demand: demand[task]}}}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if n := a.Tasks(); n != 2 {
			t.Errorf("%v: %d live tasks a lease after z fell silent, want 2", mode, n)
		}
	}
}
