package balance

// stalled reports whether e, picked stallPicks times since its last
// answer, has been suspect for stallAfter while others served, and
// ejects it if so. It is the slow path of a pick: it reads the clock and
// sums the other endpoints' service marks.
func (b *Balancer) stalled(e *Endpoint) bool {
	if e.State() != Healthy {
		return false
	}
	now := max(b.readClock(), 1)
	others := b.othersServed(e)
	since := e.suspect.Load()
	if since == 0 {
		if e.suspect.CompareAndSwap(0, now) {
			e.suspectOthers.Store(others)
			e.checked.Store(now)
		}
		return false
	}
	prev := e.checked.Swap(now)
	if others == e.suspectOthers.Load() {
		return false
	}
	// Another served since, first seen now. If an earlier look after the
	// suspicion found the others silent too, the whole subset was (a
	// tier stopped, then resumed: its tasks answer again a few
	// milliseconds apart), and e's silence while others served counts
	// from that look, or from half the stall time ago if it was long
	// before.
	seen := e.othersSeen.Load()
	if seen == 0 {
		seen = since
		if prev > since {
			seen = max(prev, now-int64(b.cfg.stallAfter)/2)
		}
		e.othersSeen.CompareAndSwap(0, seen)
	}
	if now-seen < int64(b.cfg.stallAfter) {
		return false
	}
	e.eject()
	return true
}

// othersServed sums the service marks of e's fellow endpoints: it grows
// when one of them answers, with no failure, a request picked since its
// last such answer.
func (b *Balancer) othersServed(e *Endpoint) uint64 {
	var sum uint64
	for _, x := range b.set.Load().eps {
		if x != e {
			sum += x.served.Load()
		}
	}
	return sum
}

// DoneUnanswered ends a request picked on e that reached its deadline
// with no answer from the backend: an error, and a miss. After
// WithEjection's count of misses in a row, if another endpoint served
// (answered with no failure) since the first of them, the endpoint is
// Unresponsive for the ejection time (doubled for each ejection in a
// row); after it, one more miss ejects it again, on the same condition.
func (e *Endpoint) DoneUnanswered() {
	e.w.Add(^uint64(oneActive - 1))
	e.addError()
	n := e.b.cfg.ejectAfter
	if n == 0 {
		return
	}
	m := e.misses.Load()
	if m == 0 {
		e.missOthers.Store(e.b.othersServed(e))
	}
	if m < n {
		m = e.misses.Add(1)
	}
	if m < n || e.State() != Healthy || e.b.othersServed(e) == e.missOthers.Load() && len(e.b.set.Load().eps) > 1 {
		return
	}
	e.eject()
}

// eject makes a Healthy endpoint Unresponsive for the ejection time,
// doubled for each ejection in a row. Its picks so far no longer count
// as unanswered: after the ejection it gets requests again, and is
// ejected again by a miss or by a new stall.
func (e *Endpoint) eject() {
	k := e.ejections.Load()
	if k < 16 {
		k = e.ejections.Add(1)
	}
	e.ejectFor(k)
}

// ejectFor makes a Healthy endpoint Unresponsive for the ejection time of
// the k-th ejection in a row.
func (e *Endpoint) ejectFor(k uint32) {
	e.answered.Store(e.picks.Load())
	e.clearSuspect()
	k = min(k, 16) - 1
	d := min(e.b.cfg.ejection<<k, MaxEjection)
	e.ejectedUntil.Store(e.b.readClock() + int64(d))
	e.b.lameDucks.Add(1)
	e.setState(Unresponsive, Healthy)
}

// clearSuspect ends e's suspicion of a stall.
func (e *Endpoint) clearSuspect() {
	if e.suspect.Load() != 0 || e.othersSeen.Load() != 0 {
		e.suspect.Store(0)
		e.othersSeen.Store(0)
	}
}
