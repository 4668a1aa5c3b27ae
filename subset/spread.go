package subset

import "slices"

// Connections returns how many of the clients 0..clients-1 connect to each
// of n backends under a.
func Connections(a Algorithm, clients, n, size int) []int {
	conns := make([]int, n)
	subsets := planner(a, n)
	for c := range clients {
		for _, b := range subsets(c, size) {
			conns[b]++
		}
	}
	return conns
}

// planner returns a's Subset for n backends, sharing work between clients
// where the algorithm allows (the ring, each round's shuffle), so that a
// simulation of 10,000 clients and 10,000 backends takes seconds.
func planner(a Algorithm, n int) func(client, size int) []int {
	switch a := a.(type) {
	case Ringsteady:
		rg := a.ring(n)
		return func(client, size int) []int {
			if n <= 0 || size <= 0 {
				return nil
			}
			return rg.subset(client, size)
		}
	case Deterministic:
		var round = -1
		var shuffled []int
		return func(client, size int) []int {
			if n <= 0 || size <= 0 || size >= n {
				return a.Subset(n, client, size)
			}
			count := n / size
			if r := client / count; r != round {
				round, shuffled = r, all(n)
				shuffle(shuffled, uint64(r))
			}
			id := client % count
			return slices.Clone(shuffled[id*n/count : (id+1)*n/count])
		}
	}
	return func(client, size int) []int { return a.Subset(n, client, size) }
}

// Without returns client's subset, as indices into the full list of n
// backends, when backend gone is absent: the list passed to a is the other
// n-1 backends in order, except for Ringsteady, which keeps every index
// and is told that gone is absent.
func Without(a Algorithm, n, gone, client, size int) []int {
	return without(a, n, gone)(client, size)
}

func without(a Algorithm, n, gone int) func(client, size int) []int {
	if r, ok := a.(Ringsteady); ok {
		prev := r.Present
		r.Present = func(i int) bool { return i != gone && (prev == nil || prev(i)) }
		return planner(r, n)
	}
	fewer := planner(a, n-1)
	return func(client, size int) []int {
		idx := fewer(client, size)
		for k, i := range idx {
			if i >= gone {
				idx[k] = i + 1
			}
		}
		return idx
	}
}

// Churn is the fraction of the clients whose subset changes when backend
// gone leaves (and, the algorithms being deterministic, changes back when
// it returns): the share of clients that must open new connections.
func Churn(a Algorithm, clients, n, size, gone int) float64 {
	if clients <= 0 {
		return 0
	}
	changed := 0
	full, less := planner(a, n), without(a, n, gone)
	for c := range clients {
		before := full(c, size)
		after := less(c, size)
		slices.Sort(before)
		slices.Sort(after)
		if !slices.Equal(before, after) {
			changed++
		}
	}
	return float64(changed) / float64(clients)
}
