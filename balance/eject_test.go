package balance

import (
	"math"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
)

// A backend that answers nothing (a hung process: its connection stays
// up, so it stays Healthy) is ejected once DefaultEjectAfter requests in
// a row ended at their deadlines unanswered: picks go to the others.
// After the ejection time it gets requests again; one more unanswered
// ejects it for twice as long; an answer ends the ejections. While every
// backend is ejected, picks still go to one of them.
func TestUnresponsiveBackendIsEjected(t *testing.T) {
	for _, p := range []Policy{RoundRobin, WeightedRoundRobin} {
		clk := clock.NewFake(time.Unix(0, 0))
		b, eps := newBalancer(t, clk, 2, WithPolicy(p))
		hung, answers := eps[0], true
		picks := func(n int) (onHung int) {
			for range n {
				e, err := b.Pick()
				if err != nil {
					t.Fatalf("%v: %v", p, err)
				}
				if e == hung && !answers {
					onHung++
					e.DoneUnanswered()
					continue
				}
				if e == hung {
					onHung++
				}
				e.Done(false)
			}
			return onHung
		}
		answers = false
		if n := picks(200); n != DefaultEjectAfter || hung.State() != Unresponsive {
			t.Fatalf("%v: %d requests to the hung backend, state %v; want %d, then %v", p, n, hung.State(), DefaultEjectAfter, Unresponsive)
		}
		clk.Advance(DefaultEjection + time.Millisecond)
		if n := picks(200); n != 1 || hung.State() != Unresponsive {
			t.Fatalf("%v: after the ejection, %d requests to the still hung backend before it is ejected again (state %v), want 1", p, n, hung.State())
		}
		clk.Advance(DefaultEjection + time.Millisecond)
		if n := picks(200); n != 0 {
			t.Fatalf("%v: %d requests to the backend one ejection time into its second ejection, which lasts two", p, n)
		}
		clk.Advance(DefaultEjection)
		answers = true
		if n := picks(200); n < 90 || hung.State() != Healthy {
			t.Fatalf("%v: %d of 200 requests to the backend answering again (state %v)", p, n, hung.State())
		}
		answers = false
		if n := picks(200); n != DefaultEjectAfter {
			t.Fatalf("%v: after an answer, %d requests unanswered before the backend is ejected again, want %d", p, n, DefaultEjectAfter)
		}
		eject(eps[1])
		if eps[1].State() != Unresponsive {
			t.Fatalf("%v: the second backend is %v", p, eps[1].State())
		}
		if e, err := b.Pick(); err != nil || e == nil {
			t.Fatalf("%v: every backend ejected: %v, %v", p, e, err)
		}
	}
}

// A backend on probation (its ejection over, no answer since) is probed
// with a request that may be lost: PickCritical leaves it to Pick's
// requests, and takes it only once it has waited DefaultProbeWait for
// one, so that a client with only critical traffic still probes it.
// (Under LeastLoaded its recent errors keep it out longer.)
func TestCriticalRequestsAreNotProbes(t *testing.T) {
	for _, p := range []Policy{RoundRobin, WeightedRoundRobin} {
		clk := clock.NewFake(time.Unix(0, 0))
		b, eps := newBalancer(t, clk, 2, WithPolicy(p))
		hung := eps[0]
		// picks makes n picks, critical or not, and reports how many went
		// to the hung backend, which leaves them unanswered.
		picks := func(n int, critical bool) (onHung int) {
			for range n {
				pick := b.Pick
				if critical {
					pick = b.PickCritical
				}
				e, err := pick()
				if err != nil {
					t.Fatalf("%v: %v", p, err)
				}
				if e == hung {
					onHung++
					e.DoneUnanswered()
					continue
				}
				e.Done(false)
			}
			return onHung
		}
		eject(hung)
		if hung.State() != Unresponsive {
			t.Fatalf("%v: the hung backend is %v", p, hung.State())
		}
		clk.Advance(DefaultEjection + time.Millisecond)
		if n := picks(200, true); n != 0 {
			t.Fatalf("%v: %d critical requests probed the backend on probation", p, n)
		}
		if n := picks(200, false); n != 1 || hung.State() != Unresponsive {
			t.Fatalf("%v: %d other requests probed it (state %v), want 1", p, n, hung.State())
		}
		// Only critical traffic: the probe waits DefaultProbeWait past the
		// (doubled) ejection, then one critical request takes it.
		clk.Advance(2*DefaultEjection + time.Millisecond)
		if n := picks(200, true); n != 0 {
			t.Fatalf("%v: %d critical requests probed it before it waited for a probe", p, n)
		}
		clk.Advance(DefaultProbeWait)
		if n := picks(200, true); n != 1 {
			t.Fatalf("%v: %d critical requests probed it after it waited %v for a probe, want 1", p, n, DefaultProbeWait)
		}
		// Every backend on probation: critical requests still go somewhere.
		clk.Advance(4*DefaultEjection + time.Millisecond)
		eject(eps[1])
		clk.Advance(DefaultEjection + time.Millisecond)
		if e, err := b.PickCritical(); err != nil || e == nil {
			t.Fatalf("%v: every backend on probation: %v, %v", p, e, err)
		}
	}
}

// A backend on probation is skipped even when the policy keeps choosing
// it (weighted round robin with the backend reporting itself nearly idle,
// as one whose dependencies are gone does): the skipped pick goes to
// another backend, not back to it.
func TestProbationHoldsWhenThePolicyPrefersTheBackend(t *testing.T) {
	for _, p := range []Policy{WeightedRoundRobin, LeastLoaded} {
		clk := clock.NewFake(time.Unix(0, 0))
		b, eps := newBalancer(t, clk, 3, WithPolicy(p))
		hung := eps[0]
		for i, e := range eps {
			u := 0.9
			if i == 0 {
				u = 0.01
			}
			e.Report(Load{QPS: 100, Utilization: u, Span: time.Minute})
		}
		eject(hung)
		clk.Advance(DefaultEjection + time.Millisecond)
		onHung, critical := 0, 0
		for i := range 300 {
			pick := b.Pick
			if i%2 == 0 {
				pick = b.PickCritical
			}
			e, err := pick()
			if err != nil {
				t.Fatalf("%v: %v", p, err)
			}
			if e == hung {
				onHung++
				if i%2 == 0 {
					critical++
				}
				continue // the probe hangs: never answered
			}
			e.Done(false)
		}
		if onHung > 1 || critical != 0 {
			t.Errorf("%v: %d requests (%d critical) to the backend on probation while its probe is out, want at most 1 (0)", p, onHung, critical)
		}
	}
}

// A probe answered with an error (a backend that fails fast, its own
// dependencies gone) does not end the probation: the backend is ejected
// again for as long, not doubled, and only an answer that is not an
// error brings it back.
func TestFailedProbeEjectsAgain(t *testing.T) {
	for _, p := range []Policy{RoundRobin, WeightedRoundRobin} {
		clk := clock.NewFake(time.Unix(0, 0))
		b, eps := newBalancer(t, clk, 2, WithPolicy(p))
		bad := eps[0]
		eject(bad)
		// probe makes up to 200 picks and ends the first that lands on bad
		// as told, the others answered; it reports whether one landed.
		probe := func(failed bool) bool {
			for range 200 {
				e, err := b.Pick()
				if err != nil {
					t.Fatalf("%v: %v", p, err)
				}
				if e == bad {
					e.Done(failed)
					return true
				}
				e.Done(false)
			}
			return false
		}
		for round := range 3 {
			clk.Advance(DefaultEjection + time.Millisecond)
			if !probe(true) || bad.State() != Unresponsive {
				t.Fatalf("%v, round %d: a failed probe left it %v", p, round, bad.State())
			}
		}
		clk.Advance(DefaultEjection + time.Millisecond) // not doubled
		if !probe(false) || bad.State() != Healthy {
			t.Fatalf("%v: a good probe after the failed ones left it %v", p, bad.State())
		}
		if !probe(true) || bad.State() != Healthy {
			t.Fatalf("%v: an error off probation ejected it (%v)", p, bad.State())
		}
	}
}

// An outage of the whole subset (every backend stopped, as the drill's
// storm stops a whole tier) is no outlier: with no backend answering,
// ejecting one moves nothing to another, and ejections doubled through
// the outage would keep a backend out for seconds after it, while the
// others take its share. No one is ejected; once the backends answer
// again, each takes its share at once. A request ends unanswered at its
// deadline, a second after its pick; the outage lasts 5 s.
func TestOutageOfTheWholeSubsetEjectsNoOne(t *testing.T) {
	for _, p := range []Policy{RoundRobin, WeightedRoundRobin, LeastLoaded} {
		clk := clock.NewFake(time.Unix(0, 0))
		b, eps := newBalancer(t, clk, 3, WithPolicy(p))
		type call struct {
			e  *Endpoint
			at time.Duration
		}
		var inFlight []call
		start := clk.Now()
		now := func() time.Duration { return clk.Now().Sub(start) }
		const tick = 10 * time.Millisecond
		for now() < 5*time.Second {
			for len(inFlight) > 0 && now()-inFlight[0].at >= time.Second {
				inFlight[0].e.DoneUnanswered()
				inFlight = inFlight[1:]
			}
			e, err := b.Pick()
			if err != nil {
				t.Fatalf("%v: %v", p, err)
			}
			inFlight = append(inFlight, call{e, now()})
			clk.Advance(tick)
		}
		for _, e := range eps {
			if e.State() != Healthy {
				t.Errorf("%v: %s is %v after an outage of every backend", p, e.ID(), e.State())
			}
		}
		for _, c := range inFlight { // the backlog: refused once the backends run again
			c.e.Refused()
		}
		clk.Advance(2 * time.Second) // least-loaded forgets the errors
		got := map[*Endpoint]int{}
		for range 300 {
			e, _ := b.Pick()
			got[e]++
			e.Done(false)
			clk.Advance(time.Millisecond)
		}
		for _, e := range eps {
			if got[e] < 60 {
				t.Errorf("%v: %s took %d of the 300 requests after the outage, want its share", p, e.ID(), got[e])
			}
		}
	}
}

// When a dependency the whole subset shares is gone, the backends whose
// calls to it hang are silent, and those that know it is gone fail fast
// (their throttle, "overloaded; don't retry" relayed from below): a
// failure is no proof that the others serve, so the silent ones are not
// stall-ejected as outliers, to be kept out for seconds after the
// dependency returns while the ones that failed take all the traffic.
func TestFailingOthersEjectNoOne(t *testing.T) {
	const step = 10 * time.Millisecond
	for _, p := range []Policy{RoundRobin, WeightedRoundRobin, LeastLoaded} {
		clk := clock.NewFake(time.Unix(0, 0))
		b, eps := newBalancer(t, clk, 3, WithPolicy(p))
		failing := eps[1]
		for range 300 { // 3 s
			clk.Advance(step)
			e, err := b.Pick()
			if err != nil {
				t.Fatalf("%v: %v", p, err)
			}
			if e == failing {
				e.Done(true)
			} // the others hold their requests: silent
		}
		for _, e := range eps {
			if e.State() != Healthy {
				t.Errorf("%v: %s is %v; only another's failures came back", p, e.ID(), e.State())
			}
		}
	}
}

// An ejected backend that serves again (it answers a request it held,
// with a success or a refusal of its own, as a task resumed after a pause
// answers its backlog) is back at once, not at the end of an ejection
// doubled while it was silent.
func TestServiceEndsTheEjection(t *testing.T) {
	for _, p := range []Policy{RoundRobin, WeightedRoundRobin, LeastLoaded} {
		for _, refused := range []bool{false, true} {
			clk := clock.NewFake(time.Unix(0, 0))
			b, eps := newBalancer(t, clk, 2, WithPolicy(p))
			paused := eps[0]
			eject(paused)
			held, _ := b.Pick() // picked while ejected: the other
			held.Done(false)
			paused.w.Add(oneActive) // a request it held through the pause
			clk.Advance(DefaultEjection / 4)
			if refused {
				paused.Refused()
			} else {
				paused.Done(false)
			}
			if paused.State() != Healthy {
				t.Fatalf("%v (refused %v): %v after it answered again", p, refused, paused.State())
			}
			clk.Advance(4 * time.Second) // least-loaded forgets the misses
			if n := shareOf(b, paused, 200); n < 60 {
				t.Errorf("%v (refused %v): %d of 200 requests after it answered again, want its share", p, refused, n)
			}
		}
	}
}

// Refused (the backend refused on its own account) counts as an error
// but is an answer: it ends the probation, as a success does, where
// Done(true) ejects the backend again.
func TestRefusalEndsTheProbation(t *testing.T) {
	for _, p := range []Policy{RoundRobin, WeightedRoundRobin, LeastLoaded} {
		clk := clock.NewFake(time.Unix(0, 0))
		b, eps := newBalancer(t, clk, 2, WithPolicy(p))
		busy := eps[0]
		eject(busy)
		clk.Advance(DefaultEjection + time.Millisecond)
		for range 200 {
			e, err := b.Pick()
			if err != nil {
				t.Fatalf("%v: %v", p, err)
			}
			if e == busy {
				errs := e.RecentErrors()
				e.Refused()
				if e.RecentErrors() <= errs {
					t.Errorf("%v: a refusal did not count as an error (%d, then %d)", p, errs, e.RecentErrors())
				}
				break
			}
			e.Done(false)
		}
		if busy.State() != Healthy {
			t.Fatalf("%v: a refused probe left the backend %v", p, busy.State())
		}
		clk.Advance(2 * time.Second) // least-loaded halves its recent errors each second (WithErrorWindow)
		if n := shareOf(b, busy, 200); n < 60 {
			t.Errorf("%v: %d of 200 requests to the backend after its refused probe, want its share", p, n)
		}
	}
}

// A backend that stops answering is ejected before its requests reach
// their deadlines: picked DefaultStallPicks times since its last answer,
// then nothing from it for DefaultStallAfter while the others answer.
// After the ejection it gets one request and, still silent, is ejected
// again for twice as long; once it answers it is back. A subset
// where nobody answers (long streams) and a slow backend that answers
// within the stall time are left alone.
func TestStalledBackendIsEjectedBeforeDeadlines(t *testing.T) {
	const step = 10 * time.Millisecond // between picks
	for _, p := range []Policy{RoundRobin, WeightedRoundRobin, LeastLoaded} {
		clk := clock.NewFake(time.Unix(0, 0))
		b, eps := newBalancer(t, clk, 3, WithPolicy(p))
		hung, silent := eps[0], true
		var held []*Endpoint // requests the hung backend holds
		picks := func(n int) (onHung int) {
			for range n {
				clk.Advance(step)
				e, err := b.Pick()
				if err != nil {
					t.Fatalf("%v: %v", p, err)
				}
				if e == hung {
					onHung++
					if silent {
						held = append(held, e)
						continue
					}
				}
				e.Done(false)
			}
			return onHung
		}
		// untilEjected picks until the hung backend is Unresponsive (at
		// most 3 s), returning the requests it got.
		untilEjected := func() (onHung int) {
			for range 300 {
				if hung.State() == Unresponsive {
					break
				}
				onHung += picks(1)
			}
			return onHung
		}
		// Picked about every 30 ms: the fourth pick makes it suspect,
		// 250 ms later it is out, long before any deadline.
		most := DefaultStallPicks + int(DefaultStallAfter/(3*step)) + 2
		if p == LeastLoaded { // the held requests already keep picks away
			if n := picks(300); n > most {
				t.Fatalf("%v: %d requests to the stalled backend in 3 s, want at most %d", p, n, most)
			}
			continue
		}
		if n := untilEjected(); hung.State() != Unresponsive || n > most {
			t.Fatalf("%v: %d requests to the stalled backend, state %v; want at most %d, then %v", p, n, hung.State(), most, Unresponsive)
		}
		if m := picks(int(DefaultEjection/step) - 1); m != 0 {
			t.Fatalf("%v: %d requests to the ejected backend", p, m)
		}
		// The ejection ends: on probation, one request (the probe), and
		// when nothing comes back, ejected again, for twice as long.
		if n := picks(2) + untilEjected(); n != 1 || hung.State() != Unresponsive {
			t.Fatalf("%v: after the ejection, %d requests to the still stalled backend (state %v), want 1 and %v", p, n, hung.State(), Unresponsive)
		}
		if m := picks(int(2*DefaultEjection/step) - 1); m != 0 {
			t.Fatalf("%v: %d requests during the second ejection", p, m)
		}
		for _, e := range held { // it answers what it held, and more
			e.Done(false)
		}
		held, silent = nil, false
		picks(100)
		if n := picks(300); n < 60 || hung.State() != Healthy {
			t.Fatalf("%v: %d of 300 requests to the backend answering again (state %v)", p, n, hung.State())
		}
	}

	// Nobody answers (every endpoint holds long streams): no ejection.
	clk := clock.NewFake(time.Unix(0, 0))
	b, eps := newBalancer(t, clk, 3)
	for range 300 {
		clk.Advance(step)
		if _, err := b.Pick(); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range eps {
		if e.State() != Healthy {
			t.Fatalf("streams only: %s is %v", e.ID(), e.State())
		}
	}

	// A slow backend answering every 200 ms (less than the stall time)
	// what it was picked for stays in.
	clk = clock.NewFake(time.Unix(0, 0))
	b, eps = newBalancer(t, clk, 3)
	var slow []*Endpoint
	for i := range 1000 {
		clk.Advance(step)
		e, err := b.Pick()
		if err != nil {
			t.Fatal(err)
		}
		if e != eps[0] {
			e.Done(false)
		} else {
			slow = append(slow, e)
		}
		if i%20 == 19 {
			for _, e := range slow {
				e.Done(false)
			}
			slow = slow[:0]
		}
	}
	if eps[0].State() != Healthy {
		t.Fatalf("a slow backend answering every 200 ms is %v", eps[0].State())
	}

	// WithStall(0, ...) disables it; bad settings are refused.
	clk = clock.NewFake(time.Unix(0, 0))
	b, eps = newBalancer(t, clk, 2, WithStall(0, 0))
	for range 300 {
		clk.Advance(step)
		e, _ := b.Pick()
		if e != eps[0] {
			e.Done(false)
		}
	}
	if eps[0].State() != Healthy {
		t.Fatalf("stall ejection disabled, yet the backend is %v", eps[0].State())
	}
	for _, o := range []Option{WithStall(1<<17, time.Second), WithStall(4, 0), WithStall(4, time.Hour)} {
		if _, err := New(o); err == nil {
			t.Errorf("New accepted a bad stall setting")
		}
	}
}

// A request that ends with no evidence either way (never sent, or given
// up early by its caller) is Released: it neither counts as an answer,
// which would clear the backend's misses, nor as a miss.
func TestReleaseKeepsMisses(t *testing.T) {
	b, eps := newBalancer(t, clock.NewFake(time.Unix(0, 0)), 1)
	pick := func() *Endpoint {
		e, err := b.Pick()
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	for range DefaultEjectAfter - 1 {
		pick().DoneUnanswered()
	}
	pick().Release()
	if eps[0].Active() != 0 || eps[0].State() != Healthy {
		t.Fatalf("after a release: active %d, state %v", eps[0].Active(), eps[0].State())
	}
	pick().DoneUnanswered()
	if eps[0].State() != Unresponsive {
		t.Fatalf("a release cleared the misses: state %v after %d unanswered", eps[0].State(), DefaultEjectAfter)
	}
}

// The blackout guards against weights from a backend's first seconds, not
// a client's: a report whose rates were measured over at least the
// blackout (Load.Span) counts at once, so a client that starts (or
// restarts) among long-running backends weighs them from its first
// reports; a backend younger than the blackout still waits it out.
func TestBlackoutCountsFromTheBackendsStart(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	b, eps := newBalancer(t, clk, 3, WithPolicy(WeightedRoundRobin), WithBlackout(10*time.Second))
	eps[0].Report(Load{QPS: 300, Utilization: 0.5, Span: 10 * time.Second})
	eps[1].Report(Load{QPS: 150, Utilization: 0.5, Span: time.Minute})
	eps[2].Report(Load{QPS: 150, Utilization: 0.5, Span: 2 * time.Second}) // a backend 2 s old
	b.UpdateWeights()
	if w0, w1, w2 := eps[0].Weight(), eps[1].Weight(), eps[2].Weight(); math.Abs(w0/w1-2) > 1e-9 || w2 != 0 {
		t.Fatalf("weights %v %v %v: want the long-measured two at once (2:1), the young one in its blackout", w0, w1, w2)
	}
	// The young one is weighted at the mean of the others meanwhile
	// (600, 300: 450).
	if s := shares(t, b, 4500); math.Abs(s["t0"]-4.0/9) > 0.01 || math.Abs(s["t2"]-1.0/3) > 0.01 {
		t.Fatalf("shares %v, want 4/9, 2/9, 1/3", s)
	}
	clk.Advance(10 * time.Second)
	eps[2].Report(Load{QPS: 150, Utilization: 0.5, Span: 10 * time.Second})
	b.UpdateWeights()
	if w1, w2 := eps[1].Weight(), eps[2].Weight(); w2 == 0 || math.Abs(w1/w2-1) > 1e-9 {
		t.Fatalf("after its blackout: weights %v %v", w1, w2)
	}
	// A malformed span is ignored like the rest of a malformed report.
	before := eps[1].Load()
	eps[1].Report(Load{QPS: 1, Utilization: 0.5, Span: -time.Second})
	if eps[1].Load() != before {
		t.Fatal("a report with a negative span was taken")
	}
}

// shareOf makes n picks, each answered at once, and returns how many
// went to e.
func shareOf(b *Balancer, e *Endpoint, n int) int {
	got := 0
	for range n {
		x, _ := b.Pick()
		if x == e {
			got++
		}
		x.Done(false)
	}
	return got
}

// eject leaves DefaultEjectAfter requests to e unanswered in a row while
// the others answer, which ejects it.
func eject(e *Endpoint) {
	for i := range DefaultEjectAfter {
		e.w.Add(oneActive)
		e.DoneUnanswered()
		if i > 0 {
			continue
		}
		// The others answer meanwhile: e is an outlier, not part of an
		// outage of the whole subset, which ejects no one.
		for _, x := range e.b.set.Load().eps {
			if x != e {
				x.w.Add(oneActive)
				x.picks.Add(1)
				x.Done(false)
			}
		}
	}
}
