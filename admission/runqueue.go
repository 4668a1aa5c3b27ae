package admission

import (
	"sync/atomic"

	"github.com/triagehq/triage/criticality"
)

// queueGate sheds, by criticality, the arrivals that waited in Go's run
// queue before their transport could show them to the Controller (Arrival
// RunQueued). net/http reads a request and runs its handler on the
// connection's one goroutine, so a server whose CPU is saturated holds
// its excess as runnable goroutines: the pending count never sees them,
// and each request reaching Arrive finds the task idle. The gate reads
// the interval's queueing delay instead, against the target delay plus
// one mean service time (a request may wait for the one running before
// it: a CPU-bound handler is not preempted for 10 ms).
//
// Its state is one number, the shed level x in [0, NumLevels]: the levels
// below x are shed entirely, the level x falls in by its fraction, the
// levels above not at all. So SHEDDABLE goes first and CRITICAL_PLUS
// last. Each interval x moves by a quarter of the delay's relative error
// (at most one level up, a quarter of a level down; a quarter up within
// CRITICAL and CRITICAL_PLUS), so that it settles where the delay meets
// the target.
type queueGate struct {
	x atomic.Int64 // the shed level, in 1/gateOne of a level
}

// gateOne is one level of shedding.
const gateOne = 1 << 16

// step moves the gate by the interval's queueing delay. It is called
// under the Controller's adjust lock.
func (g *queueGate) step(delay, target int64) {
	if target <= 0 {
		return
	}
	x := g.x.Load()
	dx := gateOne * (delay - target) / (4 * target)
	dx = min(max(dx, -gateOne/4), gateOne)
	if next := x + dx; next > int64(criticality.Critical)*gateOne {
		dx = min(dx, max(int64(criticality.Critical)*gateOne-x, gateOne/4))
	}
	g.x.Store(min(max(x+dx, 0), criticality.NumLevels*gateOne))
}

// share returns the probability that an arrival of level l is shed.
func (g *queueGate) share(l criticality.Level) float64 {
	return float64(g.level(l)) / gateOne
}

// level returns level l's shedding probability in 1/gateOne.
func (g *queueGate) level(l criticality.Level) int64 {
	return min(max(g.x.Load()-int64(l)*gateOne, 0), gateOne)
}

// sheds reports whether an arrival of level l is shed, drawing from
// random (uniform in [0, 1)) only when l is shed in part.
func (g *queueGate) sheds(l criticality.Level, random func() float64) bool {
	p := g.level(l)
	return p >= gateOne || p > 0 && random()*gateOne < float64(p)
}
