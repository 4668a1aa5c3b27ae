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
// and each request reaching Arrive finds the task idle.
//
// The gate decides how many RunQueued arrivals an interval lets through
// (its budget) and fills it from the top: CRITICAL_PLUS first, then
// CRITICAL, and so on, from the interval's arrivals by criticality. Its
// state is the shed level x in [0, NumLevels] this gives: the levels
// below x are shed entirely, the level x falls in by its fraction, the
// levels above not at all. The budget is the last interval's let-through
// count scaled by the run queue's wait: down by the share of an interval
// the wait grew (the admitted work over the CPU's), and down by half the
// share of an interval the wait stands over the target (the backlog to
// drain), up to a quarter more while under it; at least half and at most
// a quarter more than the last. So a step of the offered load is met in
// one interval, where a rule on the shed level alone took a second and
// more (issue 54). The Controller admits an arrival the gate would shed
// while a processor would otherwise idle (processorSpare).
//
// Between steps an arrival is also shed on the moment's backlog
// (backlogged): the goroutines in the run queue beyond those the last
// interval's arrivals found there, over the rate at which the CPU drains
// it, give the wait of the arrivals behind this one, and a level is shed
// while that wait exceeds its bound (a quarter of an interval for
// SHEDDABLE, with the pending cap's headroom for the levels above:
// CRITICAL_PLUS 1.25 intervals), once the run queue has stood over
// that length for a quarter of the bound (backlogConfirm). So the
// backlog a step of the offered load builds before the gate's next step
// is cut where it forms, rather than served an interval late; and a
// burst of goroutines that are no requests, which the CPU runs through
// far faster than its arrivals (the connections of a thousand streams
// closing at once), sheds nothing.
//
// Its counters are bounded by the arrivals of one interval; step runs
// under the Controller's adjust lock, the rest concurrently.
type queueGate struct {
	x       atomic.Int64 // the shed level, in 1/gateOne of a level
	arrived [criticality.NumLevels]atomic.Int64
	passed  atomic.Int64
	seen    [criticality.NumLevels]atomic.Int64 // arrivals of each level, for an even spread
	// limit is the most arrivals the interval lets through (0: no
	// limit), spent those it did.
	limit, spent atomic.Int64
	last         int64 // the last interval's wait (under the adjust lock)
	// most is the most arrivals an interval has let through, decaying by
	// a sixteenth an interval: what the CPU served (under the adjust lock).
	most int64
	// rate is each level's arrivals into the run queue an interval,
	// smoothed over about four, in 1/1024 of an arrival (under the adjust
	// lock).
	rate [criticality.NumLevels]int64
	// found is the mean run queue length the last interval's arrivals
	// found (under the adjust lock).
	found int64
	// shedAt is, per level, the run queue length at which an arrival is
	// shed on the moment's backlog (0: never), set by step.
	shedAt [criticality.NumLevels]atomic.Int64
	// over is, per level, when the readings of the run queue went over
	// shedAt and stayed there, plus one (0: the last was under).
	over [criticality.NumLevels]atomic.Int64
}

// minBusy is the least utilization the drain rate is scaled by: the CPU
// of a process this idle drains its run queue at ten times its arrivals.
const minBusy = 0.1

// gateOne is one level of shedding.
const gateOne = 1 << 16

// admit reports whether a RunQueued arrival of level l passes the gate,
// and counts it; one that found a backlog over its level's bound does
// not.
func (g *queueGate) admit(l criticality.Level, backlogged bool) bool {
	g.arrived[l].Add(1)
	if backlogged {
		return false
	}
	p := g.level(l)
	if p >= gateOne {
		return false
	}
	if p > 0 {
		// Let through a share 1-p of the level, evenly spread: the n-th
		// arrival passes when it completes another whole arrival's
		// worth, so that the admitted requests come regularly and the
		// CPU is not left idle by a run of refusals.
		n, a := g.seen[l].Add(1), gateOne-p
		if n*a/gateOne == (n-1)*a/gateOne {
			return false
		}
	}
	if lim := g.limit.Load(); lim > 0 && g.spent.Add(1) > lim {
		return false
	}
	g.passed.Add(1)
	return true
}

// backlogged reports whether an arrival of level l that finds runnable
// goroutines in Go's run queue at now is shed on the moment's backlog:
// the readings have found the queue over the level's bound for at least
// confirm.
func (g *queueGate) backlogged(l criticality.Level, runnable, now, confirm int64) bool {
	at := g.shedAt[l].Load()
	if at == 0 || runnable < at {
		if g.over[l].Load() != 0 { // a store only when it changes: arrivals share the line
			g.over[l].Store(0)
		}
		return false
	}
	since := g.over[l].Load()
	if since == 0 {
		g.over[l].CompareAndSwap(0, now+1)
		since = g.over[l].Load()
	}
	return now+1-since >= confirm
}

// backlogConfirm is how long the run queue must stand over level l's
// bound before backlogged sheds the level: a quarter of the bound (a
// sixteenth of the interval for SHEDDABLE, 31 ms of the default 100 ms
// for CRITICAL_PLUS). A backlog of requests lasts: its arrivals keep it
// there, and at the bound it holds four times this of work.
func backlogConfirm(l criticality.Level, interval int64) int64 {
	return interval * (100 + headroom[l]) / 1600
}

// setShedAt sets the run queue lengths backlogged sheds at from the
// interval's arrivals (those that reached Arrive): the goroutines beyond
// those they found, over the rate at which the CPU drains the queue (the
// arrivals over its utilization: Little's law at full use), are the wait
// behind an arrival, and a level's bound is a quarter of the interval
// with the pending cap's headroom for the level (headroom). So level l is
// shed from found + drain*(100+headroom[l])/400 goroutines on, whatever
// the interval's length.
func (g *queueGate) setShedAt(arrivals int64, busy float64) {
	drain := float64(arrivals) / min(max(busy, minBusy), 1)
	for l := range g.shedAt {
		at := int64(0)
		if arrivals > 0 {
			at = g.found + int64(drain*float64(100+headroom[l])/400) + 1
		}
		g.shedAt[l].Store(at)
	}
}

// step sets the shed level from the interval's arrivals and its mean run
// queue wait against target, interval being the interval's length and
// grew the run queue's growth over it. Shedding grows only when mayGrow
// (the CPU saturated, and the scheduler's own mean delay showing
// goroutines waiting): the run queue holds the process's other goroutines
// too (a frontend's calls to its backends, the transports'), which are no
// backlog of requests. busy is the CPU's utilization over the interval
// (the rate the run queue drains at scales by it).
func (g *queueGate) step(wait, target, interval, grew int64, mayGrow bool, busy float64) {
	var arrived [criticality.NumLevels]int64
	var total int64
	for l := range arrived {
		arrived[l] = g.arrived[l].Swap(0)
		total += arrived[l]
	}
	passed := g.passed.Swap(0)
	last := g.last
	g.last = wait
	g.setShedAt(total, busy)
	if total == 0 || target <= 0 || interval <= 0 {
		return
	}
	g.most = max(passed*1024, g.most-g.most/16)
	// The budget, in 1/1024 of the most an interval let through.
	f := int64(1024)
	if wait > last {
		f -= 1024 * (wait - last) / interval
	}
	if wait > target {
		f -= 512 * (wait - target) / interval
	} else {
		f += 256 * (target - wait) / target
	}
	f = min(max(f, 512), 1280)
	budget := max((g.most/1024*f+1023)/1024, 1)
	budget0 := budget
	// Fill it from the top, with the arrivals into the run queue: those
	// that left it, and its growth, in the same mix.
	in := max(total+grew, 1)
	x := int64(0)
	first := g.rate == [criticality.NumLevels]int64{}
	for l := range arrived {
		// Smoothed over about four intervals, in 1/1024 of an arrival;
		// the first interval with arrivals is taken as it is.
		if r := arrived[l] * in * 1024 / total; first {
			g.rate[l] = r
		} else {
			g.rate[l] += (r - g.rate[l]) / 4
		}
	}
	for l := criticality.NumLevels - 1; l >= 0; l-- {
		a := (g.rate[l] + 1023) / 1024
		if budget >= a {
			budget -= a
			continue
		}
		x = int64(l)*gateOne + gateOne - gateOne*budget/a
		break
	}
	over := mayGrow && wait > target
	if !over {
		x = min(x, g.x.Load()) // no more shedding without a wait to cut and a CPU to cut it on
	}
	g.x.Store(x)
	// While shedding or over the target, the budget also bounds the
	// next interval's let-through count, with room for its noise: a
	// step of the offered load finds it spent rather than the CPU's
	// next second. Otherwise nothing bounds it (a burst on an idle task
	// passes).
	g.spent.Store(0)
	if x > 0 || over {
		g.limit.Store(budget0*5/4 + 2)
	} else {
		g.limit.Store(0)
	}
}

// share returns the probability that an arrival of level l is shed.
func (g *queueGate) share(l criticality.Level) float64 {
	return float64(g.level(l)) / gateOne
}

// level returns level l's shedding probability in 1/gateOne.
func (g *queueGate) level(l criticality.Level) int64 {
	return min(max(g.x.Load()-int64(l)*gateOne, 0), gateOne)
}
