package admission

import "math"

// The controller's feedback rules are pure steps: each interval, from the
// rule's state and the interval's measurements, the next state. The
// Controller measures, calls the step under its adjust lock, and applies
// the result (stores the limit, tells the Observer, wakes waiters); the
// steps themselves touch nothing, so they are tested with step tables.
// The execution limit's rule is package limit's (limit.Rule); the pending
// cap's is here.

// stepDivisor is how far a limit or cap moves in one interval: by a
// tenth of itself, and at least one unit.
const stepDivisor = 10

// pendingRule bounds the requests admitted at arrival and not done (the
// pending cap, in thousandths of a request) from the mean time admitted
// requests wait before their handler starts: down while it exceeds the
// target, up while the cap turned requests away and the wait is under
// half the target (so that a cap one step from the target does not
// oscillate across it).
type pendingRule struct {
	target         int64 // ns
	floor, ceiling int64 // thousandths
	// maxDelay (ns, the Controller's max wait) is the longest queue the
	// CPU's reading may excuse: a mean wait past it is a standing queue,
	// whatever the CPU reads, and the cap grows for an idle CPU only as
	// far as that much work.
	maxDelay int64
}

// idleGrowth is how fast the pending cap grows while the CPU idles and the
// cap turns requests away: by idleGrowth times the idle share of itself
// per interval, at least a tenth and at most doubling. Against the delay
// rule's tenth down per saturated interval, the cap settles where the
// intervals that idle idle about 1/(idleGrowth*stepDivisor) of the time.
const idleGrowth = 4

// step is one interval: delay is its mean queueing delay (ns), hit says
// whether the cap turned a request away, busy is the CPU's busy share
// (1 when unknown), svc the mean service time (ns; 0 unknown). Work
// conservation: while the CPU is not saturated (busy below saturatedAt)
// the cap does not shrink, since a task with idle CPU has no queue of
// runnable requests to bound (the delay it measured came in bursts); and
// while it also turns requests away, the cap was too small to carry the
// task across its client's gaps, so it grows in proportion to the CPU
// left idle, up to maxDelay's worth of work. A CPU reading cannot excuse
// a mean delay past maxDelay: a burst the cap admitted drains within
// that, so a longer wait is a queue of work the CPU reading does not see
// (a neighbour or the hypervisor taking the task's CPU), and the cap
// shrinks as if saturated.
func (r pendingRule) step(pendingCap, delay int64, hit bool, busy float64, svc int64) int64 {
	saturated := busy >= saturatedAt || delay > r.maxDelay
	switch {
	case delay > r.target && saturated:
		return max(r.floor, min(pendingCap-milli/stepDivisor, pendingCap*(stepDivisor-1)/stepDivisor))
	case hit && !saturated:
		grow := int64(math.Round(float64(pendingCap) * min(1, idleGrowth*(1-busy))))
		return max(pendingCap, min(r.ceiling, r.carry(svc), pendingCap+max(milli/stepDivisor, pendingCap/stepDivisor, grow)))
	case hit && delay < r.target/2:
		return min(r.ceiling, pendingCap+max(milli/stepDivisor, pendingCap/stepDivisor))
	}
	return pendingCap
}

// carry is the most the cap grows to for an idle CPU: maxDelay's worth of
// requests of service time svc (thousandths); the ceiling when svc is
// unknown.
func (r pendingRule) carry(svc int64) int64 {
	if svc <= 0 || r.maxDelay <= 0 {
		return r.ceiling
	}
	return max(r.floor, milli*r.maxDelay/svc)
}

// usualDecay is how fast a criticality's usual occupancy falls towards
// its current one: by a fifth of the gap per interval.
const usualDecay = 5

// usualStep is one interval of a criticality's usual occupancy (x1000):
// its current occupancy at once when higher, else decaying towards it.
func usualStep(usual, now int64) int64 {
	if now >= usual {
		return now
	}
	return usual - (usual-now)/usualDecay
}
