package subset

import (
	"slices"
	"testing"
)

func spread(conns []int) (lo, hi int) { return slices.Min(conns), slices.Max(conns) }

// Figure 20-5: 300 clients, 300 backends, subsets of 10: every backend has
// exactly 10 connections.
func TestDeterministicIsExact(t *testing.T) {
	lo, hi := spread(Connections(Deterministic{}, 300, 300, 10))
	if lo != 10 || hi != 10 {
		t.Fatalf("connections %d..%d, want 10..10", lo, hi)
	}
}

// "In cases where the total number of backends is not divisible by the
// desired subset size, we allow a few subsets to be slightly larger than
// others, but ... the number of clients assigned to a backend will differ
// by at most 1."
func TestDeterministicUnevenDiffersByAtMostOne(t *testing.T) {
	for _, n := range []int{7, 12, 31, 299, 301, 307, 350} {
		for _, size := range []int{3, 10, 20} {
			for _, clients := range []int{1, 10, 299, 300, 1001} {
				conns := Connections(Deterministic{}, clients, n, size)
				if lo, hi := spread(conns); hi-lo > 1 {
					t.Errorf("n=%d size=%d clients=%d: connections %d..%d", n, size, clients, lo, hi)
				}
				for c := range clients {
					s := Deterministic{}.Subset(n, c, size)
					want := min(size, n)
					count := max(n/size, 1)
					if len(s) < want || len(s) > (n+count-1)/count || hasDup(s) {
						t.Fatalf("n=%d size=%d client %d: subset %v", n, size, c, s)
					}
				}
			}
		}
	}
}

func hasDup(s []int) bool {
	c := slices.Clone(s)
	slices.Sort(c)
	return len(slices.Compact(c)) != len(s)
}

// Clients in one round share one shuffle and take disjoint slices; the
// next round shuffles differently, so a failed backend's clients spread.
func TestDeterministicRounds(t *testing.T) {
	seen := map[int]bool{}
	for c := range 4 { // round 0 of 12 backends, subsets of 3
		for _, b := range (Deterministic{}).Subset(12, c, 3) {
			if seen[b] {
				t.Fatalf("backend %d twice in round 0", b)
			}
			seen[b] = true
		}
	}
	if len(seen) != 12 {
		t.Fatalf("round 0 covers %d backends", len(seen))
	}
	if slices.Equal(Deterministic{}.Subset(12, 0, 3), Deterministic{}.Subset(12, 4, 3)) {
		t.Fatal("rounds 0 and 1 start with the same subset")
	}
}

// Every client, whatever its build, must compute the same subsets: the
// shuffle is ours, not math/rand's, and this pins its output.
func TestShuffleIsStable(t *testing.T) {
	xs := all(12)
	shuffle(xs, 0)
	want := []int{10, 8, 2, 3, 11, 0, 7, 5, 4, 1, 9, 6}
	if !slices.Equal(xs, want) {
		t.Fatalf("shuffle(12, seed 0) = %v, want %v", xs, want)
	}
}

// Figures 20-3 and 20-4: random subsetting spreads connections widely, and
// more so for smaller subsets.
func TestRandomSpreadsWidely(t *testing.T) {
	for _, tc := range []struct {
		size           int
		maxLo, minHigh float64
	}{{90, 0.85, 1.15}, {30, 0.70, 1.30}} {
		conns := Connections(Random{Seed: 1}, 300, 300, tc.size)
		lo, hi := spread(conns)
		mean := float64(tc.size)
		if float64(lo)/mean > tc.maxLo || float64(hi)/mean < tc.minHigh {
			t.Errorf("size %d: %.2f..%.2f of the mean, want a spread at least %.2f..%.2f", tc.size, float64(lo)/mean, float64(hi)/mean, tc.maxLo, tc.minHigh)
		}
	}
}

// Ringsteady keeps the spread of deterministic subsetting within a few
// percent and changes only the subsets that held the departed backend.
func TestRingsteadyLowChurn(t *testing.T) {
	for _, tc := range []struct{ clients, n, size int }{{300, 300, 10}, {300, 300, 30}, {1000, 300, 20}, {300, 217, 10}} {
		conns := Connections(Ringsteady{}, tc.clients, tc.n, tc.size)
		lo, hi := spread(conns)
		mean := float64(tc.clients*tc.size) / float64(tc.n)
		if float64(lo) < 0.8*mean || float64(hi) > 1.2*mean {
			t.Errorf("%+v: connections %d..%d, mean %.1f", tc, lo, hi, mean)
		}
		for _, gone := range []int{0, tc.n / 2, tc.n - 1} {
			ring := Churn(Ringsteady{}, tc.clients, tc.n, tc.size, gone)
			det := Churn(Deterministic{}, tc.clients, tc.n, tc.size, gone)
			// Only the clients whose subset held the backend change.
			bound := float64(conns[gone]) / float64(tc.clients)
			if ring > bound+1e-9 || det < 0.9 {
				t.Errorf("%+v, backend %d leaves: churn ringsteady %.3f (bound %.3f), deterministic %.3f", tc, gone, ring, bound, det)
			}
		}
	}
}

func TestSubsetEdgeCases(t *testing.T) {
	for _, a := range []Algorithm{Deterministic{}, Random{}, Ringsteady{}} {
		if s := a.Subset(0, 3, 10); len(s) != 0 {
			t.Errorf("%s: no backends gave %v", a.Name(), s)
		}
		if s := a.Subset(5, 3, 0); len(s) != 0 {
			t.Errorf("%s: size 0 gave %v", a.Name(), s)
		}
		if s := a.Subset(5, 3, 10); len(s) != 5 || hasDup(s) {
			t.Errorf("%s: size above n gave %v", a.Name(), s)
		}
	}
	if _, err := ByName("consistent", 0); err == nil {
		t.Error("unknown algorithm accepted")
	}
	if got := Of([]string{"a", "b", "c"}, []int{2, 0}); !slices.Equal(got, []string{"c", "a"}) {
		t.Errorf("Of = %v", got)
	}
}

// The simulation's shared-work path gives every client the same subset as
// Subset does.
func TestPlannerMatchesSubset(t *testing.T) {
	for _, a := range []Algorithm{Deterministic{}, Random{Seed: 7}, Ringsteady{}, Ringsteady{Present: func(i int) bool { return i%7 != 3 }}} {
		for _, n := range []int{1, 12, 37, 300} {
			p := planner(a, n)
			for _, size := range []int{1, 3, 10, 400} {
				for c := range 50 {
					if got, want := p(c, size), a.Subset(n, c, size); !slices.Equal(got, want) {
						t.Fatalf("%s n=%d size=%d client %d: planner %v, Subset %v", a.Name(), n, size, c, got, want)
					}
				}
			}
		}
	}
}
