package allocate

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/quota/usage"
)

// A task cannot claim the others' room by lying about the share it holds
// (issue 21, item 3): in pessimistic mode a reported share is believed up
// to what the Allocator last granted that task, and in learning mode
// (both modes) shares handed back are capped so that a claim of the whole
// limit takes only what the other tasks have not claimed, never their
// safe share.
func TestAllocatorBoundsClaimedShares(t *testing.T) {
	p, _ := quota.New(quota.Config{Tasks: 2, Customers: map[string]quota.Limit{"a": {CPU: 4}}})
	grant := func(a *Allocator, task string, demand, claim float64) float64 {
		t.Helper()
		ls, err := a.Refresh(quota.Report{Task: task, Customers: []usage.Customer{{Customer: "a", Demand: demand, Share: claim}}})
		if err != nil {
			t.Fatal(err)
		}
		return shareOf(ls, "a")
	}
	// quota.Pessimistic, past learning: x and y split a by demand, then x lies.
	clk := clock.NewFake(time.Unix(0, 0))
	a, err := New(p, WithClock(clk), WithMode(quota.ModePessimistic), WithLease(5*time.Second), WithRefresh(time.Second))
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
	// demand in quota.ModePessimistic (which has no safe-share floor while
	// learning), by the floor in quota.ModeOptimistic.
	for _, mode := range []quota.Mode{quota.ModeOptimistic, quota.ModePessimistic} {
		a, err := New(p, WithClock(clock.NewFake(time.Unix(0, 0))), WithMode(mode))
		if err != nil {
			t.Fatal(err)
		}
		yDemand := map[quota.Mode]float64{quota.ModeOptimistic: 1, quota.ModePessimistic: 2}[mode]
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
	p, _ := quota.New(quota.Config{Tasks: 2})
	a, err := New(p, WithClock(clk), WithMaxEntries(quota.MaxReportCustomers+5), WithLease(5*time.Second), WithRefresh(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	report := func(task string, n int) error {
		r := quota.Report{Task: task}
		for i := range n {
			r.Customers = append(r.Customers, usage.Customer{Customer: fmt.Sprintf("c%d", i), Demand: 1})
		}
		_, err := a.Refresh(r)
		return err
	}
	if err := report("big", quota.MaxReportCustomers); err != nil {
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
	for range 6 { // small refreshes; big and third fall silent and are forgotten
		clk.Advance(time.Second)
		report("small", 1)
	}
	if err := report("other", quota.MaxReportCustomers); err != nil {
		t.Fatalf("after the others were forgotten: %v", err)
	}
	if _, err := New(p, WithMaxEntries(10)); err == nil {
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
	for _, mode := range []quota.Mode{quota.ModeOptimistic, quota.ModePessimistic} {
		clk := clock.NewFake(time.Unix(0, 0))
		p, _ := quota.New(quota.Config{Tasks: 3, Customers: map[string]quota.Limit{"a": {CPU: 3}}})
		a, err := New(p, WithClock(clk), WithMode(mode), WithLease(5*time.Second), WithRefresh(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		held := map[string]float64{}
		share := func(r quota.Report) float64 {
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
				share(quota.Report{Task: tk, Customers: []usage.Customer{{Customer: "a", Demand: 2, Share: held[tk]}}}) // over the limit: split by demand
			}
			clk.Advance(time.Second)
		}
		before := held["x"]
		restarted := share(quota.Report{Task: "x", NoLease: true})
		// The same report without NoLease: the floor.
		floor := share(quota.Report{Task: "x"})
		newcomer := share(quota.Report{Task: "w", NoLease: true})
		t.Logf("%v: x held %.3f; restarted %.3f; without NoLease %.3f; a new name %.3f", mode, before, restarted, floor, newcomer)
		if mode == quota.ModeOptimistic && restarted < 0.9*before {
			t.Errorf("%v: restarted task got %.3f, its predecessor held %.3f", mode, restarted, before)
		}
		if mode == quota.ModePessimistic && restarted > 0.05 {
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
	p, _ := quota.New(quota.Config{Tasks: 3, Customers: map[string]quota.Limit{"a": {CPU: 5}}})
	a, err := New(p, WithClock(clk), WithLease(5*time.Second), WithRefresh(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(6 * time.Second)
	got := map[string]float64{}
	for range 2 {
		for tk, d := range map[string]float64{"x": 1, "y": 0.5, "z": 0} {
			ls, err := a.Refresh(quota.Report{Task: tk, Customers: []usage.Customer{{Customer: "a", Demand: d}}})
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

// Each customer's limit is split where its demand lands; a customer with
// no demand anywhere gets 1/N per task; tasks unheard of for a lease are
// forgotten.
func TestAllocatorSplitsByDemand(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	p, _ := quota.New(quota.Config{Customers: map[string]quota.Limit{"ads": {CPU: 4}, "idle": {CPU: 1}}, Tasks: 3})
	a, err := New(p, WithClock(clk), WithLease(10*time.Second), WithRefresh(2*time.Second))
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
	if l1.Tasks != 3 || l1.Fallback != quota.Safe || l1.Duration != 10*time.Second || l1.Refresh != 2*time.Second {
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
	p, _ := quota.New(quota.Config{})
	a, _ := New(p, WithMaxTasks(5))
	for i := range 5 {
		if _, err := a.Refresh(report(fmt.Sprintf("t%d", i), nil)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Refresh(report("t5", nil)); err != ErrTooManyTasks {
		t.Errorf("sixth task: %v", err)
	}
	for i, r := range []quota.Report{
		{Task: ""},
		{Task: "t1", Customers: []usage.Customer{{Customer: "a b"}}},
		{Task: "t1", Customers: []usage.Customer{{Customer: "a"}, {Customer: "a"}}},
		{Task: "t1", Customers: []usage.Customer{{Customer: "a", Demand: math.Inf(1)}}},
		{Task: "t1", Customers: []usage.Customer{{Customer: "a", Used: [4]float64{-1}}}},
		{Task: "t1", Customers: []usage.Customer{{Customer: "a", Share: 1.5}}},
	} {
		if _, err := a.Refresh(r); err == nil {
			t.Errorf("bad report %d accepted", i)
		}
	}
	for i, o := range [][]Option{
		{WithLease(time.Second), WithRefresh(2 * time.Second)}, {WithRefresh(0)}, {WithMaxTasks(0)}, {WithLease(48 * time.Hour)},
	} {
		if _, err := New(p, o...); err == nil {
			t.Errorf("bad options %d accepted", i)
		}
	}
	if _, err := New(nil); err == nil {
		t.Error("no policy")
	}
}

// BenchmarkAllocatorRefresh: one refresh of a task reporting 1,000
// customers, at a leader holding 1,000 such tasks of a 10,000-customer
// policy (bench/cmd/quotascale measures the same over gRPC).
func BenchmarkAllocatorRefresh(b *testing.B) {
	const tasks, customers, perTask = 1000, 10000, 1000
	cs := make(map[string]quota.Limit, customers)
	name := func(i int) string { return fmt.Sprintf("customer-%d", i) }
	for i := range customers {
		cs[name(i)] = quota.Limit{CPU: 0.01 * float64(1+i%10)}
	}
	p, err := quota.New(quota.Config{Tasks: tasks, Customers: cs})
	if err != nil {
		b.Fatal(err)
	}
	clk := clock.NewFake(time.Unix(0, 0))
	a, err := New(p, WithClock(clk), WithLease(15*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	reports := make([]quota.Report, tasks)
	for i := range reports {
		r := quota.Report{Task: fmt.Sprintf("task-%d", i), Customers: make([]usage.Customer, perTask)}
		first := i * customers / tasks
		for j := range perTask {
			c := (first + j) % customers
			d := 0.001 * float64(1+(c+i)%7)
			r.Customers[j] = usage.Customer{Customer: name(c), Demand: d, Used: [criticality.NumLevels]float64{2: d}}
		}
		reports[i] = r
	}
	for _, r := range reports {
		a.Refresh(r)
	}
	clk.Advance(16 * time.Second) // past learning
	for _, r := range reports {
		a.Refresh(r)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%tasks == 0 {
			clk.Advance(5 * time.Millisecond)
		}
		if _, err := a.Refresh(reports[i%tasks]); err != nil {
			b.Fatal(err)
		}
	}
}

func report(task string, demand map[string]float64) quota.Report {
	r := quota.Report{Task: task}
	for c, d := range demand {
		r.Customers = append(r.Customers, usage.Customer{Customer: c, Used: [4]float64{criticality.Critical: d / 2}, Demand: d})
	}
	return r
}

func shareOf(ls quota.Lease, customer string) float64 {
	for _, g := range ls.Grants {
		if g.Customer == customer {
			return g.Share
		}
	}
	return ls.Default.Share
}
