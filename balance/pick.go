package balance

import (
	"math"
)

// pick is Pick without counting the request.
func (b *Balancer) pick() (*Endpoint, error) {
	s := b.set.Load()
	n := len(s.eps)
	if n == 0 {
		return nil, ErrNoEndpoint
	}
	// Every pick advances the round robin position by one, or more when it
	// skips ineligible endpoints: that one shared add also paces the clock
	// reads, about one pick in 64.
	next := b.rr.Add(1)
	if next&63 == 0 {
		s = b.tick(s)
	}
	var e *Endpoint
	crossed := false // skips moved the position past a multiple of 64
	switch b.cfg.policy {
	case LeastLoaded:
		e = b.leastLoaded(s, next)
	case WeightedRoundRobin:
		if len(s.sched) > 0 {
			if c := s.eps[s.sched[next%uint64(len(s.sched))]]; c.eligible(b.cfg.maxActive) {
				e = c
				break
			}
		}
		e, crossed = b.roundRobin(s.eps, next)
	default:
		e, crossed = b.roundRobin(s.eps, next)
	}
	if crossed {
		s = b.tick(s)
	}
	if e == nil {
		for _, x := range s.eps {
			if x.w.Load()&notHealthy == 0 {
				return nil, ErrFlowControl
			}
		}
		if e = b.lameDuckPick(s.eps, next); e == nil {
			return nil, ErrNoEndpoint
		}
	}
	return e, nil
}

// lameDuckPick is the pick when no endpoint is healthy: lame duck tasks
// still serve, so a request goes to one of them (round robin from start,
// under the flow-control cap) rather than fail. It first lets expired
// announcements go.
func (b *Balancer) lameDuckPick(eps []*Endpoint, start uint64) *Endpoint {
	if b.lameDucks.Load() == 0 {
		return nil
	}
	b.expireLameDucks(eps, b.readClock())
	n := uint64(len(eps))
	for i := range n {
		e := eps[(start+i)%n]
		if st := e.State(); st == LameDuck || st == Unresponsive || e.eligible(b.cfg.maxActive) {
			if b.cfg.maxActive == 0 || e.Active() < b.cfg.maxActive {
				return e
			}
		}
	}
	return nil
}

// expireLameDucks makes Healthy the endpoints whose lame duck
// announcement is older than DefaultLameDuckExpiry, or whose ejection is
// over, and recounts the others.
func (b *Balancer) expireLameDucks(eps []*Endpoint, now int64) {
	var left int64
	for _, e := range eps {
		switch e.State() {
		case LameDuck:
			if now-e.lameAt.Load() >= int64(DefaultLameDuckExpiry) {
				e.expire(LameDuck)
			} else {
				left++
			}
		case Unresponsive:
			if now >= e.ejectedUntil.Load() {
				e.expire(Unresponsive)
			} else {
				left++
			}
		}
	}
	b.lameDucks.Store(left)
}

// tick is the periodic work of picks, about one in 64: it reads the
// clock, lets expired lame duck announcements go, decays errors and
// recomputes weights when their period is over. It returns the endpoint
// set to pick from.
func (b *Balancer) tick(s *endpointSet) *endpointSet {
	now := b.readClock()
	if b.lameDucks.Load() > 0 {
		b.expireLameDucks(s.eps, now)
	}
	if epoch := now / int64(b.cfg.errorWindow); epoch > b.errEpoch.Load() {
		b.decayErrors(s.eps, epoch)
	}
	if b.cfg.policy == WeightedRoundRobin && now >= b.nextUpdate.Load() {
		b.updateWeights(now)
		return b.set.Load()
	}
	return s
}

// roundRobin returns the first eligible endpoint from position start,
// and moves the position past it, so that skipped endpoints do not hand
// their turns to the next eligible one. crossed says the move passed a
// multiple of 64, where the position would have called tick: skips must
// not starve the periodic work (with every other endpoint skipped, the
// position would only ever be odd).
func (b *Balancer) roundRobin(eps []*Endpoint, start uint64) (e *Endpoint, crossed bool) {
	n := uint64(len(eps))
	for i := range n {
		if e := eps[(start+i)%n]; e.eligible(b.cfg.maxActive) {
			if i > 0 {
				after := b.rr.Add(i)
				crossed = after>>6 != (after-i)>>6
			}
			return e, crossed
		}
	}
	return nil, false
}

// leastLoaded is round robin among the eligible endpoints with the fewest
// active requests plus weighted recent errors: one pass from a rotating
// start, keeping the first llCandidates endpoints with the least load. Of
// those, the one whose report shows the lowest utilization is picked (the
// first on a tie). Comparing a few, not all, is what keeps stale reports
// from herding: with many clients each sending little, active counts are
// mostly zero, and clients that all sent to the least utilized backend of
// their subset until its next report would overload it; here it gets at
// most llCandidates times its round robin share.
func (b *Balancer) leastLoaded(s *endpointSet, next uint64) *Endpoint {
	ws := s.ws
	n := len(ws)
	start := int(next % uint64(n))
	maxActive := uint64(b.cfg.maxActive)
	if maxActive == 0 {
		maxActive = math.MaxUint64
	}
	// Two passes, from start to the end and from 0 to start, so that the
	// loops need no wrap-around. The load is one shift of the endpoint's
	// word, with the not-healthy bit above it; an endpoint is skipped by
	// one comparison with limit: the best load so far, plus one while the
	// candidates are not complete.
	var idx [llCandidates]int
	var ww [llCandidates]uint64
	nc := 0
	best, limit := uint64(unhealthyLoad), uint64(unhealthyLoad)
	done := false
	for k, p := range ws[start:] {
		w := p.Load()
		if l := w >> loadShift; l < limit && w&activeMask < maxActive {
			if l < best {
				best, nc = l, 0
			}
			idx[nc], ww[nc] = start+k, w
			nc++
			if limit = best + 1; nc == llCandidates {
				if limit = best; best == 0 {
					done = true
					break
				}
			}
		}
	}
	if !done {
		for k, p := range ws[:start] {
			w := p.Load()
			if l := w >> loadShift; l < limit && w&activeMask < maxActive {
				if l < best {
					best, nc = l, 0
				}
				idx[nc], ww[nc] = k, w
				nc++
				if limit = best + 1; nc == llCandidates {
					if limit = best; best == 0 {
						break
					}
				}
			}
		}
	}
	if nc == 0 {
		return nil
	}
	pick, util := idx[0], ww[0]&utilMask
	for k := 1; k < nc; k++ {
		if u := ww[k] & utilMask; u < util {
			pick, util = idx[k], u
		}
	}
	if at := (pick - start + n) % n; at > 0 {
		b.rr.Add(uint64(at)) // the next pick starts after this one: round robin among the least loaded
	}
	return s.eps[pick]
}

// llCandidates is how many of the least loaded endpoints least-loaded
// compares by reported utilization: the most a backend reporting the
// lowest utilization can get is this many times its round robin share
// among the least loaded. Measured on the loopback spread test (two slow,
// two fast backends): 1.65 with 2, 1.49-1.50 with 3, 1.51 with all of
// them, against grpc-go least_request's 1.60-1.66. With all of them, the
// simulator (1000 clients, subsets of 20, each client sending little, so
// that active counts are mostly zero) showed stale reports herding
// clients onto a few backends and leaving others at 5% utilization; with
// 3 it wastes 14% of the CPU against round robin's 24% (triage sim lb).
const llCandidates = 3

const unhealthyLoad = notHealthy >> loadShift
