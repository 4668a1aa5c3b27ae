// Package subset chooses which backend tasks a client task connects to.
//
// SRE book ch. 20, "Limiting the Connections Pool with Subsetting": a client
// connects to a subset of 20 to 100 of the backends, and the selection
// algorithm must spread clients uniformly over backends. This package has
// the book's three answers and one from after the book:
//
//   - Random: each client shuffles the backends and keeps the first few,
//     the naive baseline of Figures 20-3 and 20-4 (the least loaded backend
//     gets 50-63% of the mean connections, the most loaded 121-150%).
//   - Deterministic: the book's algorithm. Clients are grouped in rounds of
//     len(backends)/size; each round shuffles the backends with the round
//     number as seed; a client takes the slice at its position in the
//     round. Every backend gets the same number of connections (Figure
//     20-5), within one when the numbers do not divide evenly. But adding
//     or removing a backend reshuffles every round: almost every client's
//     subset changes.
//   - Ringsteady: consistent subsetting on a ring whose positions come from
//     a low-discrepancy sequence ("Reinventing Backend Subsetting at
//     Google", ACM Queue 2022). Backend task i sits at the bit-reversal of
//     i, client j at the bit-reversal of j, and a client takes the size
//     backends that follow its position. Removing or adding a backend
//     changes only the subsets that contained it, at the price of a
//     slightly wider spread than Deterministic.
//
// Backends are identified by their position in the slice: the task index,
// which must be the same in every client (sort addresses, or use the
// scheduler's task numbers). A backend that is down keeps its index; pass
// the full list and let a Keeper replace a failing member for as long as
// it fails, or use Ringsteady, whose subsets only change where the
// backend was. DefaultSize is the size to use when nothing says otherwise:
// the low end of the book's "20 to 100".
//
// The functions allocate the returned subset and, for the shuffling ones, one
// scratch slice of len(backends); nothing else. All are deterministic: the
// shuffles use a PCG generator and a Fisher-Yates shuffle implemented here,
// so clients built with different Go versions agree on every subset.
package subset

import (
	"cmp"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
)

// Algorithm chooses a client's subset.
type Algorithm interface {
	// Subset returns the indices (into a list of n backends) of client's
	// subset of the given size; all n when size >= n.
	Subset(n, client, size int) []int
	// Name is the algorithm's name on the command line.
	Name() string
}

// ByName returns the algorithm named "deterministic", "random" or
// "ringsteady".
func ByName(name string, seed uint64) (Algorithm, error) {
	switch name {
	case "deterministic":
		return Deterministic{}, nil
	case "random":
		return Random{Seed: seed}, nil
	case "ringsteady":
		return Ringsteady{}, nil
	}
	return nil, fmt.Errorf("subset: unknown algorithm %q (want deterministic, random or ringsteady)", name)
}

// Of returns the backends at the given indices.
func Of[T any](backends []T, idx []int) []T {
	out := make([]T, len(idx))
	for i, j := range idx {
		out[i] = backends[j]
	}
	return out
}

func all(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// Deterministic is the book's deterministic subsetting.
//
// When n is not a multiple of size, each round still has n/size subsets,
// and the round's shuffled list is cut into that many pieces whose sizes
// differ by at most one, so a few subsets are slightly larger than size ("we
// allow a few subsets to be slightly larger than others"). Every backend is
// thus in exactly one subset per round, and connection counts differ by at
// most one (only the last, partial round leaves some backends out).
type Deterministic struct{}

// Name returns "deterministic".
func (Deterministic) Name() string { return "deterministic" }

// Subset implements Algorithm.
func (Deterministic) Subset(n, client, size int) []int {
	if n <= 0 || size <= 0 {
		return nil
	}
	if size >= n {
		return all(n)
	}
	count := n / size // subsets per round
	round, id := client/count, client%count
	shuffled := all(n)
	shuffle(shuffled, uint64(round))
	// The round's n backends are cut into count consecutive pieces whose
	// sizes differ by at most one (size or a little more).
	lo, hi := id*n/count, (id+1)*n/count
	return slices.Clip(shuffled[lo:hi])
}

// Random is random subsetting: each client shuffles the backends with a
// seed of its own (derived from Seed and the client's id) and keeps the
// first size. It is the baseline the book rejects.
type Random struct{ Seed uint64 }

// Name returns "random".
func (Random) Name() string { return "random" }

// Subset implements Algorithm.
func (r Random) Subset(n, client, size int) []int {
	if n <= 0 || size <= 0 {
		return nil
	}
	if size >= n {
		return all(n)
	}
	shuffled := all(n)
	shuffle(shuffled, r.Seed^uint64(client)*0x9e3779b97f4a7c15^0x52616e646f6d)
	return slices.Clip(shuffled[:size])
}

// Ringsteady is consistent subsetting with low-discrepancy positions. Backend
// i is placed on a ring of 2^32 positions at the bit-reversal of i (the van
// der Corput sequence, which fills the ring evenly whatever n is), client j
// at the bit-reversal of j; client j's subset is the size backends at or
// after its position, clockwise. A backend that leaves or joins changes
// only the subsets it was or will be in: about size/n of the clients.
//
// Ringsteady places backends by index, so removing a backend means passing
// Present.
type Ringsteady struct {
	// Present, if not nil, says which of the n indices exist (a backend
	// removed from the middle of a job keeps its neighbours' indices).
	Present func(i int) bool
}

// Name returns "ringsteady".
func (Ringsteady) Name() string { return "ringsteady" }

func position(i int) uint32 { return bits.Reverse32(uint32(i)) }

// Subset implements Algorithm.
func (r Ringsteady) Subset(n, client, size int) []int {
	if n <= 0 || size <= 0 {
		return nil
	}
	return r.ring(n).subset(client, size)
}

// ring is the present backends sorted by position.
type ring []int

func (r Ringsteady) ring(n int) ring {
	rg := make(ring, 0, n)
	for i := range n {
		if r.Present == nil || r.Present(i) {
			rg = append(rg, i)
		}
	}
	slices.SortFunc(rg, func(a, b int) int { return cmp.Compare(position(a), position(b)) })
	return rg
}

func (rg ring) subset(client, size int) []int {
	if size >= len(rg) {
		return slices.Clone(rg)
	}
	start, _ := slices.BinarySearchFunc(rg, position(client), func(i int, p uint32) int { return cmp.Compare(position(i), p) })
	out := make([]int, size)
	for k := range out {
		out[k] = rg[(start+k)%len(rg)]
	}
	return out
}

// shuffle is a Fisher-Yates shuffle driven by PCG seeded with seed: the
// same seed gives the same order on every platform and Go version.
func shuffle(xs []int, seed uint64) {
	g := rand.NewPCG(seed, 0x7472696167652d73) // "triage-s"
	for i := len(xs) - 1; i > 0; i-- {
		j := bounded(g, uint64(i+1))
		xs[i], xs[j] = xs[j], xs[i]
	}
}

// bounded returns a uniform integer in [0, n) by Lemire's multiply-shift
// with rejection.
func bounded(g *rand.PCG, n uint64) int {
	hi, lo := bits.Mul64(g.Uint64(), n)
	if lo < n {
		thresh := -n % n
		for lo < thresh {
			hi, lo = bits.Mul64(g.Uint64(), n)
		}
	}
	return int(hi)
}
