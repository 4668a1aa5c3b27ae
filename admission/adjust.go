package admission

import (
	"time"

	"github.com/triagehq/triage/admission/limit"
	"github.com/triagehq/triage/criticality"
)

// maybeAdjust revisits the execution limit and the pending cap once per
// interval, on whichever request comes first.
func (c *Controller) maybeAdjust(now int64) {
	if now < c.nextAdjust.Load() || !c.adjust.TryLock() {
		return
	}
	defer c.adjust.Unlock()
	if now < c.nextAdjust.Load() {
		return
	}
	intervals := max(1, (now-c.nextAdjust.Load())/c.interval+1) // since the last adjustment
	c.nextAdjust.Store(now + c.interval)
	if c.saturation != nil {
		c.busy = c.saturation.Utilization()
		c.saturated.Store(c.busy >= saturatedAt)
	}
	c.adjustPending()
	if c.waitServices > 0 {
		c.mu.Lock()
		for r := range c.queues {
			c.queues[r].roll()
		}
		c.mu.Unlock()
	}
	n, sum := c.svcCount.Swap(0), c.svcSum.Swap(0)
	var own int64
	if pn, ps := c.probeCount.Swap(0), c.probeSum.Swap(0); pn > 0 {
		own = ps / pn
	}
	waited := c.waited.Swap(false)
	if n == 0 {
		// No measured request finished: no evidence of the service time.
		// The estimate halves with each such interval, so that a stale
		// one (requests held across a pause of the process) cannot
		// refuse every request for its deadline, and so measure nothing
		// new, for good.
		c.expectedSvc.Store(c.expectedSvc.Load() >> min(intervals, 62))
		return
	}
	mean := sum / n
	c.expectedSvc.Store(mean)
	c.measuredSvc.Store(mean)
	if n >= sampleAbove {
		c.sampleMask.Store(sampleMaskHeavy)
	} else {
		c.sampleMask.Store(0)
	}
	last := c.ls.Limit
	c.ls = c.limits.Step(c.ls, limit.Sample{Mean: time.Duration(mean), Probe: time.Duration(own), Waited: waited})
	c.ls.Limit = min(max(c.ls.Limit, c.minLimit), c.maxLimit) // whatever the rule says
	c.probeResume.Store(c.ls.Resume)
	c.probingNow.Store(c.ls.Probing)
	if next := c.ls.Limit; next != last {
		c.limit.Store(next)
		c.tell(Event{Kind: LimitChanged, Limit: int(next)})
		if next > last {
			c.mu.Lock()
			c.dispatch()
			c.mu.Unlock()
		}
	}
}

// adjustPending revisits each criticality's usual occupancy and the
// pending cap. c.adjust is held.
func (c *Controller) adjustPending() {
	for l := range c.lv {
		c.lv[l].usual.Store(usualStep(c.lv[l].usual.Load(), c.levelOccupancy(criticality.Level(l))*1000))
	}
	hit := c.capHit.Swap(false)
	delay, ok := c.queueDelay()
	if p := c.paused.Load(); p != c.pausedSeen {
		// The run queue's waits through a pause of the process are the
		// pause's (the sampled delays leave it out on their own).
		c.pausedSeen = p
		ok = ok && c.sched == nil
	}
	if !ok {
		return
	}
	c.lastDelay.Store(delay)
	// Shedding grows only on a saturated CPU whose scheduler itself shows
	// goroutines waiting: the run queue's length counts every goroutine of
	// the process, requests or not.
	grow := c.busy >= saturatedAt && delay > int64(c.targetDelay)/2
	c.gate.step(c.runQueueWait(delay), int64(c.targetDelay)+c.expectedSvc.Load(), c.interval, c.runQueueGrowth(), grow, c.busy)
	c.pendingCap.Store(c.pending.step(c.pendingCap.Load(), delay, hit, c.busy, c.expectedSvc.Load()))
}

// runQueueWait is the wait of the RunQueued arrivals of the interval:
// the goroutines in Go's run queues they found, on average, over the rate
// at which they left it (Little's law), read where the run queue's length
// can be (a runnableSource); else the scheduler's mean delay, which lags
// the queue (it counts the waits of the goroutines that ran) and is
// thinned by the many that wait for nothing.
func (c *Controller) runQueueWait(delay int64) int64 {
	n, sum, reads := c.rqArrivals.Swap(0), c.rqRunnable.Swap(0), c.rqReads.Swap(0)
	if reads == 0 || n == 0 {
		c.gate.found = 0
		c.rqWait.Store(delay)
		return delay
	}
	c.gate.found = sum / reads
	w := max(delay, sum*c.interval/reads/n)
	c.rqWait.Store(w)
	return w
}

// runQueueGrowth is how many goroutines Go's run queues gained since the
// last interval (0 where their length cannot be read).
func (c *Controller) runQueueGrowth() int64 {
	if c.runq == nil {
		return 0
	}
	n, ok := c.runq.runnable()
	if !ok {
		return 0
	}
	grew := int64(n) - c.rqLast
	c.rqLast = int64(n)
	return grew
}

// queueDelay is the interval's mean queueing delay, if it has a
// measurement: the scheduler's, or its sampled requests' from Arrive to
// Start.
func (c *Controller) queueDelay() (int64, bool) {
	if c.sched != nil {
		d, n := c.sched.read()
		return int64(d), n > 0
	}
	n, sum := c.delayCount.Swap(0), c.delaySum.Swap(0)
	if n == 0 {
		return 0, false
	}
	return sum / n, true
}
