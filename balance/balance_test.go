package balance

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
)

func newBalancer(t testing.TB, clk clock.Clock, ids int, opts ...Option) (*Balancer, []*Endpoint) {
	t.Helper()
	b, err := New(append([]Option{WithClock(clk)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, ids)
	for i := range names {
		names[i] = fmt.Sprintf("t%d", i)
	}
	eps, err := b.SetEndpoints(names)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range eps {
		e.SetState(Healthy)
	}
	return b, eps
}

func TestRoundRobinSkipsUnhealthyAndLameDuck(t *testing.T) {
	b, eps := newBalancer(t, clock.NewFake(time.Unix(0, 0)), 4)
	eps[1].SetState(LameDuck)
	eps[2].SetState(Refusing)
	counts := map[string]int{}
	for range 100 {
		e, err := b.Pick()
		if err != nil {
			t.Fatal(err)
		}
		counts[e.ID()]++
		e.Done(false)
	}
	if counts["t0"] != 50 || counts["t3"] != 50 || len(counts) != 2 {
		t.Fatalf("picks %v, want t0 and t3 50 each", counts)
	}
	eps[2].SetState(Refusing)
	eps[0].SetState(LameDuck)
	eps[3].SetState(LameDuck)
	// Every reachable endpoint in lame duck: they still serve, so picks go
	// to them rather than fail (issue 22, item 3), never to the refusing
	// one.
	counts = map[string]int{}
	for range 30 {
		e, err := b.Pick()
		if err != nil {
			t.Fatalf("all lame duck: %v", err)
		}
		counts[e.ID()]++
		e.Done(false)
	}
	if counts["t2"] != 0 || len(counts) != 3 {
		t.Fatalf("all lame duck: picks %v, want t0, t1 and t3", counts)
	}
	for _, e := range eps {
		e.SetState(Refusing)
	}
	if _, err := b.Pick(); err != ErrNoEndpoint {
		t.Fatalf("all refusing: %v", err)
	}
}

// A lame duck announcement expires (issue 22, item 3): a task that
// started in lame duck (warm-up) and then became ready, announced only by
// response trailers, gets traffic again DefaultLameDuckExpiry after the
// last announcement instead of never; a task still in lame duck renews the
// mark with its next answer.
func TestLameDuckExpires(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	b, eps := newBalancer(t, clk, 2)
	eps[1].SetState(LameDuck)
	pick := func(n int) map[string]int {
		counts := map[string]int{}
		for range n {
			e, err := b.Pick()
			if err != nil {
				t.Fatal(err)
			}
			counts[e.ID()]++
			e.Done(false)
		}
		return counts
	}
	if c := pick(200); c["t1"] != 0 {
		t.Fatalf("lame duck picked: %v", c)
	}
	clk.Advance(DefaultLameDuckExpiry + time.Millisecond)
	if c := pick(200); c["t1"] < 80 {
		t.Fatalf("after the lame duck mark expired: %v", c)
	}
	eps[1].SetState(LameDuck) // announced again
	clk.Advance(DefaultLameDuckExpiry / 2)
	if c := pick(200); c["t1"] != 0 {
		t.Fatalf("renewed lame duck picked: %v", c)
	}
}

// "When this active-request count reaches a configured limit, the client
// treats the backend as unhealthy and no longer sends it requests."
func TestFlowControlCap(t *testing.T) {
	for _, p := range []Policy{RoundRobin, LeastLoaded, WeightedRoundRobin} {
		b, eps := newBalancer(t, clock.NewFake(time.Unix(0, 0)), 3, WithPolicy(p), WithMaxActive(2))
		var held []*Endpoint
		for range 6 {
			e, err := b.Pick()
			if err != nil {
				t.Fatalf("%v: %v", p, err)
			}
			held = append(held, e)
		}
		for _, e := range eps {
			if e.Active() != 2 {
				t.Fatalf("%v: %s has %d active", p, e.ID(), e.Active())
			}
		}
		if _, err := b.Pick(); err != ErrFlowControl {
			t.Fatalf("%v: all at the cap: %v", p, err)
		}
		held[0].Done(false)
		if e, err := b.Pick(); err != nil || e != held[0] {
			t.Fatalf("%v: after one Done got %v, %v", p, e, err)
		}
	}
}

// The book's table: active requests 2 1 0 0 1 0 2 0 0 1 on t0..t9; new
// requests go to the least loaded (t2, t3, t5, t7, t8), round robin among
// them, until all but t0 and t6 have one.
func TestLeastLoadedBookExample(t *testing.T) {
	b, eps := newBalancer(t, clock.NewFake(time.Unix(0, 0)), 10, WithPolicy(LeastLoaded))
	for i, n := range []int64{2, 1, 0, 0, 1, 0, 2, 0, 0, 1} {
		eps[i].w.Add(uint64(n) * oneActive)
	}
	got := map[string]bool{}
	for range 5 {
		e, err := b.Pick()
		if err != nil {
			t.Fatal(err)
		}
		got[e.ID()] = true
	}
	for _, id := range []string{"t2", "t3", "t5", "t7", "t8"} {
		if !got[id] {
			t.Fatalf("picked %v, want each of t2 t3 t5 t7 t8 once", got)
		}
	}
	want := []int64{2, 1, 1, 1, 1, 1, 2, 1, 1, 1}
	for i, e := range eps {
		if e.Active() != want[i] {
			t.Fatalf("t%d has %d active, want %d", i, e.Active(), want[i])
		}
	}
	eps[4].Done(false) // t4's request finishes: it gets the next one
	if e, _ := b.Pick(); e != eps[4] {
		t.Fatalf("picked %s, want t4", e.ID())
	}
}

// Among endpoints with the same load, least-loaded prefers the one whose
// report shows the lowest utilization; equal reports keep round robin; a
// lower load still beats a lower utilization.
func TestLeastLoadedTieBreaksOnReportedUtilization(t *testing.T) {
	b, eps := newBalancer(t, clock.NewFake(time.Unix(0, 0)), 3, WithPolicy(LeastLoaded))
	eps[0].Report(Load{QPS: 100, Utilization: 0.95})
	eps[1].Report(Load{QPS: 100, Utilization: 0.30})
	eps[2].Report(Load{QPS: 100, Utilization: 0.95})
	e, err := b.Pick()
	if err != nil || e != eps[1] {
		t.Fatalf("all idle: picked %v (%v), want t1, the least utilized", e.ID(), err)
	}
	// t1 now has one active: t0 and t2 (no active, same utilization) share
	// the next picks round robin.
	got := map[string]int{}
	for range 2 {
		e, _ := b.Pick()
		got[e.ID()]++
	}
	if got["t0"] != 1 || got["t2"] != 1 {
		t.Fatalf("picks %v, want t0 and t2 once each", got)
	}
	// All have one active; t1 is still the least utilized.
	if e, _ := b.Pick(); e != eps[1] {
		t.Fatalf("equal load: picked %s, want t1", e.ID())
	}
	eps[1].Report(Load{QPS: 100, Utilization: 7}) // far above 1: the top eighth
	eps[0].Report(Load{QPS: 100, Utilization: math.NaN()})
	if e, _ := b.Pick(); e == eps[1] {
		t.Fatalf("t1 has 2 active and reports overload; picked it over t0 and t2 with 1")
	}
}

// Stale reports do not herd: with every endpoint idle, the one reporting
// the lowest utilization wins only when it is one of the two candidates,
// so it gets more than its round robin share but at most llCandidates
// times it.
func TestLeastLoadedUtilizationTieBreakIsBounded(t *testing.T) {
	b, eps := newBalancer(t, clock.NewFake(time.Unix(0, 0)), 8, WithPolicy(LeastLoaded))
	for i, e := range eps {
		u := 0.9
		if i == 5 {
			u = 0.1
		}
		e.Report(Load{QPS: 100, Utilization: u})
	}
	const picks = 8000
	got := 0
	for range picks {
		e, err := b.Pick()
		if err != nil {
			t.Fatal(err)
		}
		if e == eps[5] {
			got++
		}
		e.Done(false)
	}
	share := float64(got) / picks
	if share <= 1.0/8 || share > llCandidates/8.0 {
		t.Fatalf("the least utilized endpoint got %.3f of picks, want more than 1/8 and at most %d/8", share, llCandidates)
	}
}

// sinkholeShare runs 10 backends on virtual time: nine hold each request
// 10 ms, one answers every request at once with an error. Requests arrive
// 2 per ms for 10 s. It returns the failing backend's share of requests.
func sinkholeShare(t *testing.T, opts ...Option) float64 {
	clk := clock.NewFake(time.Unix(0, 0))
	b, eps := newBalancer(t, clk, 10, append([]Option{WithPolicy(LeastLoaded)}, opts...)...)
	bad := eps[3]
	type pending struct {
		e   *Endpoint
		end time.Duration
	}
	var inflight []pending
	var toBad, total int
	for ms := range 10000 {
		now := time.Duration(ms) * time.Millisecond
		clk.Set(time.Unix(0, 0).Add(now))
		b.readClock()
		keep := inflight[:0]
		for _, p := range inflight {
			if p.end <= now {
				p.e.Done(false)
			} else {
				keep = append(keep, p)
			}
		}
		inflight = keep
		for range 2 {
			e, err := b.Pick()
			if err != nil {
				t.Fatal(err)
			}
			total++
			if e == bad {
				toBad++
				e.Done(true)
				continue
			}
			inflight = append(inflight, pending{e, now + 10*time.Millisecond})
		}
	}
	return float64(toBad) / float64(total)
}

// "If a task is seriously unhealthy, it might start serving 100% errors
// ... clients might start sending a very large amount of traffic to the
// unhealthy task": counting recent errors as active requests prevents it.
func TestLeastLoadedCountsErrors(t *testing.T) {
	with := sinkholeShare(t)
	without := sinkholeShare(t, WithErrorWeight(0))
	t.Logf("failing backend's share: %.3f with errors counted, %.3f without (fair share 0.100)", with, without)
	if with > 0.1 {
		t.Errorf("with errors counted the failing backend got %.3f of requests, more than its fair share", with)
	}
	if without < 0.5 {
		t.Errorf("without errors counted the failing backend got only %.3f: the test does not reproduce sinkholing", without)
	}
}

func report(e *Endpoint, qps, eps, util float64) {
	e.Report(Load{QPS: qps, EPS: eps, Utilization: util})
}

func shares(t *testing.T, b *Balancer, n int) map[string]float64 {
	t.Helper()
	counts := map[string]float64{}
	for range n {
		e, err := b.Pick()
		if err != nil {
			t.Fatal(err)
		}
		counts[e.ID()]++
		e.Done(false)
	}
	for k := range counts {
		counts[k] /= float64(n)
	}
	return counts
}

func TestWeightedRoundRobinFollowsCapability(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	b, eps := newBalancer(t, clk, 3, WithPolicy(WeightedRoundRobin))
	// t0 serves 300 qps at 50% utilization (600 per unit), t1 and t2 150
	// at 50% (300 per unit): t0 is twice as capable.
	report(eps[0], 300, 0, 0.5)
	report(eps[1], 150, 0, 0.5)
	report(eps[2], 150, 0, 0.5)
	b.UpdateWeights()
	if s := shares(t, b, 3000); math.Abs(s["t0"]-1.0/3) > 0.01 {
		t.Fatalf("during the blackout: %v, want equal shares", s)
	}
	clk.Advance(11 * time.Second)
	for _, e := range eps { // reports keep coming
		e.Report(e.Load())
	}
	b.UpdateWeights()
	s := shares(t, b, 4000)
	if math.Abs(s["t0"]-0.5) > 0.01 || math.Abs(s["t1"]-0.25) > 0.01 {
		t.Fatalf("after the blackout: %v, want 0.5 / 0.25 / 0.25", s)
	}
	if w0, w1 := eps[0].Weight(), eps[1].Weight(); math.Abs(w0/w1-2) > 1e-9 {
		t.Fatalf("weights %v %v", w0, w1)
	}
	// Errors cost: t0 failing one query in two has its score cut to
	// qps / (0.5 + 1*150/300) = 300 (equal to the others).
	report(eps[0], 300, 150, 0.5)
	b.UpdateWeights()
	if s := shares(t, b, 3000); math.Abs(s["t0"]-1.0/3) > 0.01 {
		t.Fatalf("with errors: %v, want equal shares", s)
	}
	// Reports older than the expiry are forgotten: t0 (still reporting)
	// alone has a score, the others get the mean.
	clk.Advance(4 * time.Minute)
	report(eps[0], 300, 0, 0.5)
	clk.Advance(11 * time.Second)
	report(eps[0], 300, 0, 0.5)
	b.UpdateWeights()
	if eps[1].Weight() != 0 || eps[0].Weight() == 0 {
		t.Fatalf("expiry: weights %v %v", eps[0].Weight(), eps[1].Weight())
	}
	if s := shares(t, b, 3000); math.Abs(s["t0"]-1.0/3) > 0.01 {
		t.Fatalf("after expiry: %v, want equal shares (the mean for the silent ones)", s)
	}
}

// The weights are recomputed by Pick itself once the period is over.
func TestWeightsUpdateFromPick(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	b, eps := newBalancer(t, clk, 2, WithPolicy(WeightedRoundRobin), WithBlackout(0))
	report(eps[0], 400, 0, 0.5)
	report(eps[1], 100, 0, 0.5)
	clk.Advance(2 * time.Second)
	s := shares(t, b, 10000)
	if s["t0"] < 0.75 {
		t.Fatalf("shares %v, want about 0.8 / 0.2 once Pick updated the weights", s)
	}
}

func TestBadInput(t *testing.T) {
	for _, opts := range [][]Option{
		{WithPolicy(7)}, {WithMaxActive(-1)}, {WithErrorWindow(0)}, {WithWeightPeriod(-time.Second)},
		{WithExpiry(0)}, {WithBlackout(-1)}, {WithErrorWeight(-1)}, {WithErrorPenalty(math.NaN())}, {WithErrorPenalty(-1)},
	} {
		if _, err := New(opts...); err == nil {
			t.Errorf("New accepted %v", opts)
		}
	}
	b, eps := newBalancer(t, clock.NewFake(time.Unix(0, 0)), 2, WithPolicy(WeightedRoundRobin), WithBlackout(0))
	for _, l := range []Load{{QPS: math.NaN()}, {QPS: -1}, {Utilization: math.Inf(1)}, {EPS: -3}} {
		eps[0].Report(l)
	}
	b.UpdateWeights()
	if eps[0].Weight() != 0 {
		t.Errorf("malformed reports gave weight %v", eps[0].Weight())
	}
	if _, err := b.SetEndpoints([]string{"a", "a"}); err == nil {
		t.Error("duplicate endpoints accepted")
	}
	if _, err := ParsePolicy("random"); err == nil {
		t.Error("unknown policy parsed")
	}
	if p, err := ParsePolicy("least_loaded"); err != nil || p != LeastLoaded {
		t.Errorf("ParsePolicy: %v %v", p, err)
	}
}

// Replacing the subset keeps what the balancer knows of backends that stay.
func TestSetEndpointsKeepsState(t *testing.T) {
	b, eps := newBalancer(t, clock.NewFake(time.Unix(0, 0)), 3)
	eps[1].SetState(LameDuck)
	e, _ := b.Pick()
	now, err := b.SetEndpoints([]string{"t1", "t0", "t9"})
	if err != nil {
		t.Fatal(err)
	}
	if now[0] != eps[1] || now[0].State() != LameDuck || now[1] != eps[0] || now[2].State() != Refusing {
		t.Fatalf("endpoints not carried over: %v", now)
	}
	e.Done(false) // Done on an endpoint that may have left is harmless
}

// A quiet client's weights follow the reports without waiting for 64
// picks: the Report that finds the period over recomputes them. (Without
// a blackout, an endpoint's first report counts at once.)
func TestWeightsUpdateFromReport(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	b, eps := newBalancer(t, clk, 2, WithPolicy(WeightedRoundRobin), WithBlackout(0))
	report(eps[0], 400, 0, 0.5)
	report(eps[1], 100, 0, 0.5)
	if eps[0].Weight() != 800 || eps[1].Weight() != 200 {
		t.Fatalf("first reports: weights %v %v, want 800 and 200 at once", eps[0].Weight(), eps[1].Weight())
	}
	clk.Advance(100 * time.Millisecond)
	report(eps[0], 100, 0, 0.5)
	if eps[0].Weight() != 800 {
		t.Fatal("weights computed before the period was over")
	}
	clk.Advance(time.Second) // one period, not one pick
	report(eps[0], 100, 0, 0.5)
	if eps[0].Weight() != 200 || eps[1].Weight() != 200 || b.rr.Load() != 0 {
		t.Fatalf("weights %v %v after the period, want 200 and 200 without picks", eps[0].Weight(), eps[1].Weight())
	}
}

// A load report of enormous rate at a vanishing utilization (from a
// broken or hostile backend) gives a finite weight, and the schedule
// still holds both endpoints (found by FuzzLoadReport in triagegrpc/lb).
func TestExtremeReportGivesFiniteWeight(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	_, eps := newBalancer(t, clk, 2, WithPolicy(WeightedRoundRobin), WithBlackout(0))
	report(eps[0], 1e300, 0, 1e-300)
	report(eps[1], 100, 0, 0.5)
	clk.Advance(1100 * time.Millisecond)
	report(eps[0], 1e300, 0, 1e-300)
	for _, e := range eps {
		if w := e.Weight(); math.IsInf(w, 0) || math.IsNaN(w) || w <= 0 {
			t.Errorf("weight %v", w)
		}
	}
}

// Connected (the adapter: the connection is up) makes a Refusing
// endpoint Healthy and leaves a lame duck one in lame duck (under the
// lock that orders state changes, so an announcement an answer brings
// meanwhile is never undone).
func TestConnectedKeepsLameDuck(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	_, eps := newBalancer(t, clk, 2)
	eps[0].SetState(Refusing)
	eps[0].Connected()
	if s := eps[0].State(); s != Healthy {
		t.Fatalf("Refusing, then connected: %v, want healthy", s)
	}
	eps[1].SetState(LameDuck)
	eps[1].Connected()
	if s := eps[1].State(); s != LameDuck {
		t.Fatalf("lame duck, then connected: %v, want lame duck", s)
	}
}

// reportDuring delivers one report to e while the balancer recomputes its
// weights for the first time (WeightsUpdated is called with the update
// in progress), as a second backend's out-of-band report does when it
// arrives while the first one's is being weighed.
type reportDuring struct {
	Nop
	e    *Endpoint
	done bool
}

func (r *reportDuring) WeightsUpdated(*Balancer) {
	if !r.done {
		r.done = true
		report(r.e, 100, 0, 0.5)
	}
}

// A report that arrives while the weights are being recomputed is not
// lost: the update in progress runs again with it. Two backends' first
// out-of-band reports arrive at once; the client's weights must hold
// both, not wait for the next report (10 s away) to see the second.
func TestReportDuringUpdateIsWeighed(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	obs := &reportDuring{}
	_, eps := newBalancer(t, clk, 2, WithPolicy(WeightedRoundRobin), WithBlackout(0), WithObserver(obs))
	obs.e = eps[1]
	report(eps[0], 400, 0, 0.5)
	if !obs.done {
		t.Fatal("the first report did not update the weights")
	}
	if eps[0].Weight() != 800 || eps[1].Weight() != 200 {
		t.Fatalf("weights %v and %v, want 800 and 200: the report that came during the update was lost", eps[0].Weight(), eps[1].Weight())
	}
}
