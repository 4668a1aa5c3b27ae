package quota

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
)

func TestParseMode(t *testing.T) {
	for _, m := range []Mode{ModeOptimistic, ModePessimistic} {
		got, err := ParseMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	for _, s := range []string{"", "Pessimistic", "safe", "optimistic "} {
		if _, err := ParseMode(s); err == nil {
			t.Errorf("ParseMode(%q) accepted", s)
		}
	}
	if _, err := NewEnforcer(&Policy{}, mustUsage(t), WithMode(Mode(7))); err == nil {
		t.Error("NewEnforcer accepted mode 7")
	}
	for _, h := range []float64{-0.1, 0.95, nanF()} {
		if _, err := NewEnforcer(&Policy{}, mustUsage(t), WithHeadroom(h)); err == nil {
			t.Errorf("NewEnforcer accepted headroom %v", h)
		}
	}
}

func nanF() float64 { var z float64; return z / z }

func mustUsage(t *testing.T) *Usage {
	t.Helper()
	u, err := NewUsage()
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// A pessimistic Enforcer never serves more than its limit in any 1 s
// window, even when demand arrives all at once at 20x the limit; an
// optimistic one overshoots at the onset.
func TestPessimisticHoldsTheLimitAheadOfUsage(t *testing.T) {
	for _, mode := range []Mode{ModeOptimistic, ModePessimistic} {
		clk := clock.NewFake(time.Unix(0, 0))
		p, err := New(Config{Customers: map[string]Limit{"a": {CPU: 0.5, Hard: true}}})
		if err != nil {
			t.Fatal(err)
		}
		u, _ := NewUsage(WithClock(clk))
		e, err := NewEnforcer(p, u, WithClock(clk), WithMode(mode))
		if err != nil {
			t.Fatal(err)
		}
		if e.Mode() != mode {
			t.Fatalf("Mode() = %v, want %v", e.Mode(), mode)
		}
		// 10 CPU-s/s of 2 ms requests for 5 s; per 10 ms bucket, the CPU served.
		var served [500]float64
		for i := range served {
			for range 50 {
				r, err := e.Reserve("a", criticality.Sheddable)
				if err != nil {
					continue
				}
				e.Done("a", criticality.Sheddable, r, 2*time.Millisecond)
				served[i] += 0.002
			}
			clk.Advance(10 * time.Millisecond)
		}
		peak := 0.0
		for i := 0; i+100 <= len(served); i++ {
			s := 0.0
			for _, v := range served[i : i+100] {
				s += v
			}
			peak = max(peak, s)
		}
		t.Logf("%v: peak sliding 1 s = %.3f CPU-s against a limit of 0.5", mode, peak)
		switch mode {
		case ModePessimistic:
			if peak > 0.5 {
				t.Errorf("pessimistic: %.3f CPU-s in a 1 s window, limit 0.5", peak)
			}
			if peak < 0.5*(1-DefaultHeadroom)*0.95 {
				t.Errorf("pessimistic: only %.3f CPU-s in the best 1 s window: the budget is not filling", peak)
			}
		case ModeOptimistic:
			if peak <= 0.5 {
				t.Errorf("optimistic: peak %.3f; expected the measured limit to overshoot at the onset", peak)
			}
		}
	}
}

// Cancel gives the reservation back; a request whose real cost exceeds
// what it reserved is charged the difference.
func TestPessimisticSettlesAndCancels(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	p, _ := New(Config{Customers: map[string]Limit{"a": {CPU: 1, Hard: true}}})
	u, _ := NewUsage(WithClock(clk))
	e, err := NewEnforcer(p, u, WithClock(clk), WithMode(ModePessimistic), WithHeadroom(0))
	if err != nil {
		t.Fatal(err)
	}
	r0, err := e.Reserve("a", criticality.Critical) // a new budget starts empty
	if err != nil {
		t.Fatal(err)
	}
	e.Cancel("a", r0)
	clk.Advance(time.Second) // the budget fills to its cap: 50 ms
	admitted := func() int {
		n := 0
		for {
			r, err := e.Reserve("a", criticality.Critical)
			if err != nil {
				var want = e.errOut
				if !errors.Is(err, want) && err != want {
					t.Fatalf("refusal %v", err)
				}
				return n
			}
			if r.cpu != initialCost.Seconds() {
				t.Fatalf("reserved %v, want the initial guess %v", r.cpu, initialCost.Seconds())
			}
			e.Cancel("a", r)
			n++
			if n > 1000 {
				return n
			}
		}
	}
	if n := admitted(); n <= 1000 {
		t.Fatalf("with every reservation cancelled, only %d admitted", n)
	}
	// One request reserves 1 ms but costs 80 ms: the budget is 30 ms in
	// debt and refuses until it has filled back for 30 ms.
	r, err := e.Reserve("a", criticality.Critical)
	if err != nil {
		t.Fatal(err)
	}
	e.Done("a", criticality.Critical, r, 80*time.Millisecond)
	if _, err := e.Reserve("a", criticality.Critical); err == nil {
		t.Fatal("admitted while the budget is in debt")
	}
	clk.Advance(29 * time.Millisecond)
	if _, err := e.Reserve("a", criticality.Critical); err == nil {
		t.Fatal("admitted after 29 ms of a 30 ms debt")
	}
	clk.Advance(2 * time.Millisecond)
	if _, err := e.Reserve("a", criticality.Critical); err != nil {
		t.Fatalf("refused once the debt is paid: %v", err)
	}
}

// The budgets are bounded like the Usage: customers beyond MaxTracked
// share the Other budget.
func TestPessimisticBudgetsBounded(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	p, _ := New(Config{Default: Limit{CPU: 1, Hard: true}})
	u, _ := NewUsage(WithClock(clk), WithMaxTracked(10))
	e, _ := NewEnforcer(p, u, WithClock(clk), WithMode(ModePessimistic))
	clk.Advance(time.Second)
	for i := range 1000 {
		name := "c" + string(rune('a'+i%26)) + string(rune('a'+i/26%26))
		if r, err := e.Reserve(name, criticality.Critical); err == nil {
			e.Done(name, criticality.Critical, r, time.Microsecond)
		}
	}
	if n := len(e.budgets.byName); n > 11 {
		t.Fatalf("%d budgets, bound 10 + Other", n)
	}
}

// A new leader's Allocator in ModePessimistic hands out, while it learns,
// no share a task does not report holding (issue 24): tasks still enforce
// the old leader's grants until they report, so a task that claims nothing
// (a new task, or one whose lease ran out) gets 0, not the safe share,
// until the old grants have expired. The sum of the shares the tasks
// enforce, old and new, never passes 1 across the failover.
func TestPessimisticFailoverNeverOverGrants(t *testing.T) {
	p, _ := New(Config{Tasks: 4, Customers: map[string]Limit{"a": {CPU: 4, Hard: true}}})
	clk := clock.NewFake(time.Unix(0, 0))
	const lease = 5 * time.Second
	newAlloc := func() *Allocator {
		a, err := NewAllocator(p, WithClock(clk), WithAllocatorMode(ModePessimistic), WithLease(lease), WithRefresh(time.Second))
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
		ls, err := a.Refresh(Report{Task: task, Customers: []CustomerUsage{{Customer: "a", Demand: demand, Share: claim}}, NoLease: claim == 0})
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
	p, _ := New(Config{Tasks: tasks})
	clk := clock.NewFake(time.Unix(0, 0))
	a, err := NewAllocator(p, WithClock(clk), WithMaxTasks(tasks), WithLease(5*time.Second), WithRefresh(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	report := func(i int) Report {
		r := Report{Task: fmt.Sprintf("t%d", i)}
		for j := range perTask {
			r.Customers = append(r.Customers, CustomerUsage{Customer: fmt.Sprintf("c%d", (i+j)%100), Demand: 0.01})
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
	clk.Advance(6 * time.Second)
	before := a.accounted
	if _, err := a.Refresh(report(0)); err != nil {
		t.Fatal(err)
	}
	if got, want := a.accounted-before, uint64((tasks-1)*perTask+2*perTask); got > want {
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
// ModePessimistic too, and the shares it hands out still never sum past 1;
// without it, such a task gets nothing for a lease.
func TestFreshStartGivesTheSafeShare(t *testing.T) {
	p, _ := New(Config{Tasks: 3, Customers: map[string]Limit{"a": {CPU: 3, Hard: true}}})
	for _, fresh := range []bool{false, true} {
		opts := []AllocatorOption{WithClock(clock.NewFake(time.Unix(0, 0))), WithAllocatorMode(ModePessimistic)}
		if fresh {
			opts = append(opts, WithFreshStart())
		}
		a, err := NewAllocator(p, opts...)
		if err != nil {
			t.Fatal(err)
		}
		sum := 0.0
		var first float64
		for i, task := range []string{"x", "y", "z", "w"} {
			ls, err := a.Refresh(Report{Task: task, NoLease: true, Customers: []CustomerUsage{{Customer: "a", Demand: 1}}})
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
	p, _ := New(Config{Tasks: 3, Customers: map[string]Limit{"a": {CPU: 3}, "idle": {CPU: 3}}})
	for _, mode := range []Mode{ModeOptimistic, ModePessimistic} {
		clk := clock.NewFake(time.Unix(0, 0))
		a, err := NewAllocator(p, WithClock(clk), WithAllocatorMode(mode), WithLease(5*time.Second), WithRefresh(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		held := map[string]float64{}
		round := func() float64 {
			sum := 0.0
			for _, task := range []string{"x", "y", "z"} {
				ls, err := a.Refresh(Report{Task: task, Customers: []CustomerUsage{{Customer: "a", Demand: 1, Share: held[task]}}})
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
