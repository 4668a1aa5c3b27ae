package balance

import (
	"cmp"
	"math"
	"slices"
)

// Report records a load report from the backend (from a response trailer
// or an out-of-band stream).
func (e *Endpoint) Report(l Load) {
	if !(l.QPS >= 0) || !(l.EPS >= 0) || !(l.Utilization >= 0) || math.IsInf(l.QPS+l.EPS+l.Utilization, 0) || l.Span < 0 {
		return // malformed: ignored
	}
	now := e.b.readClock()
	e.mu.Lock()
	e.load = l
	fresh := e.firstReport == 0 || now-e.lastReport > int64(e.b.cfg.expiry)
	if fresh {
		e.firstReport = max(now, 1)
	}
	e.lastReport = now
	e.mu.Unlock()
	e.setUtilization(l.Utilization)
	// A quiet client (fewer than 64 picks a period) still recomputes its
	// weights on time: reports read the clock anyway. Without a blackout,
	// an endpoint's first report counts at once (an out-of-band report
	// before the client's first call).
	if b := e.b; b.cfg.policy == WeightedRoundRobin && (now >= b.nextUpdate.Load() || fresh && l.Span >= b.cfg.blackout) {
		b.updateWeights(now)
	}
}

// setUtilization puts the reported utilization, in eighths (0 to 7; 1 and
// above is 7), in the least-loaded key, where it breaks ties between
// endpoints with equal load.
func (e *Endpoint) setUtilization(u float64) {
	bits := uint64(min(7, u*8)) << keyShift // u is finite and >= 0 (Report checks)
	for {
		w := e.w.Load()
		if w&utilMask == bits || e.w.CompareAndSwap(w, w&^utilMask|bits) {
			return
		}
	}
}

// Load returns the latest load report.
func (e *Endpoint) Load() Load {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.load
}

// score is A58's capability score of a report, 0 if unusable.
func (e *Endpoint) score(now int64, cfg *config) float64 {
	e.mu.Lock()
	l, first, last := e.load, e.firstReport, e.lastReport
	e.mu.Unlock()
	if first == 0 || now-last > int64(cfg.expiry) || now-first < int64(cfg.blackout) && l.Span < cfg.blackout {
		return 0
	}
	if l.QPS <= 0 || l.Utilization <= 0 {
		return 0
	}
	u := l.Utilization + cfg.errorPenalty*l.EPS/l.QPS
	return min(l.QPS/u, maxScore)
}

// maxScore bounds a capability score (queries per second per unit of
// utilization), so that a report of enormous rate at a vanishing
// utilization yields a finite weight, and sums of weights stay finite.
const maxScore = 1e12

// UpdateWeights recomputes the capability scores and the schedule now,
// without waiting for the period.
func (b *Balancer) UpdateWeights() { b.updateWeights(b.readClock()) }

// updateWeights recomputes the weights, or, when another goroutine holds
// b.update, leaves the recomputation to it: a report that arrives during
// another's recomputation is weighed when that one ends, not at the next
// report.
func (b *Balancer) updateWeights(now int64) {
	b.stale.Store(true)
	for b.stale.Load() && b.update.TryLock() {
		b.stale.Store(false)
		b.nextUpdate.Store(now + int64(b.cfg.period))
		s := b.set.Load()
		b.set.Store(&endpointSet{eps: s.eps, ws: s.ws, sched: b.schedule(s.eps, now)})
		b.cfg.obs.WeightsUpdated(b)
		b.update.Unlock()
		now = b.readClock()
	}
}

// unlockUpdate releases b.update and does the recomputation asked for
// while it was held.
func (b *Balancer) unlockUpdate() {
	b.update.Unlock()
	if b.stale.Load() {
		b.updateWeights(b.readClock())
	}
}

// schedule computes the weights and returns the WeightedRoundRobin
// schedule: endpoint indices, each endpoint about weight/min-weight times,
// interleaved by smooth weighted round robin. Endpoints without a usable
// score get the mean of the others (A58). Nil when no endpoint has a
// score: round robin applies.
func (b *Balancer) schedule(eps []*Endpoint, now int64) []uint16 {
	if b.cfg.policy != WeightedRoundRobin || len(eps) == 0 {
		return nil
	}
	w := make([]float64, len(eps))
	var sum float64
	scored := 0
	for i, e := range eps {
		w[i] = e.score(now, &b.cfg)
		e.weight.Store(math.Float64bits(w[i]))
		if w[i] > 0 {
			sum += w[i]
			scored++
		}
	}
	if scored == 0 {
		return nil
	}
	mean := sum / float64(scored)
	lo := math.Inf(1)
	for i := range w {
		if w[i] == 0 {
			w[i] = mean
		}
		lo = min(lo, w[i])
	}
	// Slots per endpoint: weight / lowest weight, scaled so that the
	// lightest gets 8 slots (precision of 1/8) or fewer if the schedule
	// would exceed maxSlots.
	scale := 8 / lo
	var total float64
	for _, x := range w {
		total += x * scale
	}
	if total > maxSlots {
		scale *= maxSlots / total
	}
	slots := make([]int, len(w))
	n := 0
	for i, x := range w {
		slots[i] = max(1, int(math.Round(x*scale)))
		n += slots[i]
	}
	// Interleave: endpoint i's k slots sit at (j + phase_i) / k for j < k,
	// with phases spread by the golden ratio so that endpoints of equal
	// weight alternate; the schedule is the slots sorted by position.
	type slot struct {
		pos float64
		i   uint16
	}
	all := make([]slot, 0, n)
	for i, k := range slots {
		phase := math.Mod(float64(i)*0.6180339887498949, 1)
		for j := range k {
			all = append(all, slot{(float64(j) + phase) / float64(k), uint16(i)})
		}
	}
	slices.SortFunc(all, func(x, y slot) int { return cmp.Compare(x.pos, y.pos) })
	sched := make([]uint16, len(all))
	for k, x := range all {
		sched[k] = x.i
	}
	return sched
}
