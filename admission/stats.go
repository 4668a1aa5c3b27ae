package admission

import (
	"time"

	"github.com/triagehq/triage/criticality"
)

// Degrade reports whether a request of level l should be served a degraded
// (cheaper) answer because the task is near its limit: the task is full
// (its occupancy has reached the pending cap, or requests wait for
// execution slots), or a signal is within 0.1 of the level's threshold. SRE book ch. 21: "a degraded response ... when its request to
// the DB Frontend failed"; here the handler can choose before it fails.
func (c *Controller) Degrade(l criticality.Level) bool {
	if !l.Valid() {
		l = criticality.Default
	}
	if c.queued.Load() > 0 || c.occupancy(c.now()) >= c.capFor(criticality.Sheddable) {
		c.tell(Event{Kind: Degraded, Level: l})
		return true
	}
	for i := range c.gates {
		g := &c.gates[i]
		if g.sig.Utilization() >= g.th.Start[l]-0.1 {
			c.tell(Event{Kind: Degraded, Level: l})
			return true
		}
	}
	return false
}

// Stats is a snapshot for metrics.
type Stats struct {
	Limit, Pending, Executing, Queued int64
	// Away is the running requests waiting on downstream calls (Away).
	Away int64
	// Stalled is the running requests waiting on their own clients
	// (Stall); they are not in Pending.
	Stalled int64
	// PendingCap is the current bound on pending requests (before
	// criticality headroom; fractional, see capFor).
	PendingCap float64
	// ServiceTime is the mean service time of the last interval.
	ServiceTime time.Duration
	// QueueDelay is the mean queueing delay of the last interval
	// (WithDelayMeasure).
	QueueDelay time.Duration
	// RunQueueWait is the wait the gate read for RunQueued arrivals in
	// the last interval: the goroutines in Go's run queues over the rate
	// at which arrivals leave it.
	RunQueueWait time.Duration
	// Saturated says whether the pending cap applies (WithSaturation).
	Saturated bool
	// Busy is the saturation signal's last reading (WithSaturation); 1
	// without one.
	Busy float64
	// Paused is the total length of the pauses of the process the
	// Controller has seen (left out of its measurements).
	Paused time.Duration
	// Probing says whether this interval runs at the minimum limit to
	// measure the baseline service time.
	Probing bool
	// NotStarted is, per criticality, the requests admitted whose
	// goroutine has not run (Scheduled) nor reached Start.
	NotStarted [criticality.NumLevels]int64
	// RetryShare is the share of retries among recent requests.
	RetryShare float64
	// Forced is, per criticality, the fraction of requests a ForceShed
	// drill rejects now (0: none).
	Forced [criticality.NumLevels]float64
	// QueueShed is, per criticality, the share of RunQueued arrivals shed
	// now for the queueing delay (reason Queue).
	QueueShed [criticality.NumLevels]float64
	// Signals are the current utilizations, by signal name (nil without
	// WithSignal).
	Signals map[string]float64
	// Attempts is the attempt histogram (SRE book ch. 21, Figure 21-1):
	// per criticality and attempt counter, the requests that arrived since
	// the Controller started, from the same samples as the window of it
	// the don't-retry rule reads (the last DefaultHistoryWindow): under
	// heavy traffic, when only one request in eight is sampled, each
	// sampled request counts for eight.
	Attempts [criticality.NumLevels][AttemptBuckets]uint64
}

// Overloaded reports whether the Controller rejected a request for load
// within the last interval: the task is shedding. It is the overload
// signal quota enforcement uses to decide when soft limits apply
// (quota.WithOverload).
func (c *Controller) Overloaded() bool {
	return c.now()-c.lastShed.Load() < c.interval
}

// AttemptBuckets is the number of buckets of the attempt histogram: the
// attempt counter's values 0 (first attempt), 1 and 2 (the book's three
// attempts; a larger counter counts as 2).
const AttemptBuckets = 3

// Stats returns a snapshot.
func (c *Controller) Stats() Stats {
	s := Stats{
		Limit: c.limit.Load(), Pending: c.occupancy(c.now()), Executing: c.hot.executing.Load(), Queued: c.queued.Load(), Away: c.away.Load(),
		Stalled:     c.stalled.Load(),
		PendingCap:  float64(c.pendingCap.Load()) / milli,
		ServiceTime: time.Duration(c.expectedSvc.Load()),
		QueueDelay:  time.Duration(c.lastDelay.Load()), Saturated: c.saturated.Load(),
		RunQueueWait: time.Duration(c.rqWait.Load()),
		Busy:         1,
		Paused:       time.Duration(c.paused.Load()),
		Probing:      c.probingNow.Load(),
	}
	if c.saturation != nil {
		s.Busy = c.saturation.Utilization()
	}
	now := c.now()
	for l := range s.NotStarted {
		s.NotStarted[l] = c.notStarted(criticality.Level(l))
		s.Forced[l] = c.forced(criticality.Level(l), now)
		s.QueueShed[l] = c.gate.share(criticality.Level(l))
	}
	if w, _ := c.attempts.Sums(c.now()); w.A > 0 {
		s.RetryShare = w.B / w.A
	}
	for l := range s.Attempts {
		for a := range s.Attempts[l] {
			s.Attempts[l][a] = c.attempted[l][a].Load()
		}
	}
	if len(c.gates) > 0 {
		s.Signals = make(map[string]float64, len(c.gates))
		for _, g := range c.gates {
			s.Signals[g.sig.Name()] = g.sig.Utilization()
		}
	}
	return s
}
