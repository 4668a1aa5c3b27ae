package balance

import (
	"sync/atomic"
	"testing"

	"github.com/triagehq/triage/clock"
)

// BenchmarkPick is one pick and its Done for each policy over a subset of
// 100 healthy endpoints on the real clock; the target is 100 ns and
// 0 allocs. Under LeastLoaded every endpoint holds one active request so
// that the scan cannot stop early at an idle one (its worst case).
func BenchmarkPick(b *testing.B) {
	for _, p := range []Policy{RoundRobin, LeastLoaded, WeightedRoundRobin} {
		b.Run(p.String(), func(b *testing.B) {
			bal, eps := newBalancer(b, clock.Real(), 100, WithPolicy(p), WithBlackout(0))
			for i, e := range eps {
				e.Report(Load{QPS: float64(100 + i), Utilization: 0.5})
				if p == LeastLoaded {
					e.w.Add(oneActive)
				}
			}
			bal.UpdateWeights()
			if p == WeightedRoundRobin && len(bal.set.Load().sched) == 0 {
				b.Fatal("no schedule")
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					e, err := bal.Pick()
					if err != nil {
						b.Fatal(err)
					}
					e.Done(false)
				}
			})
		})
	}
}

// BenchmarkPickFloor is what any round robin over a shared position costs,
// run beside BenchmarkPick for scale: one shared atomic add and an index.
// On two cores it is bounded by moving the counter's cache line between
// them, which no picker sharing a position avoids.
func BenchmarkPickFloor(b *testing.B) {
	var pos atomic.Uint64
	eps := make([]*int, 100)
	for i := range eps {
		eps[i] = new(int)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		n := 0
		for pb.Next() {
			n += *eps[pos.Add(1)%uint64(len(eps))]
		}
		_ = n
	})
}
