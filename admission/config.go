package admission

import (
	"fmt"
	"math"
	"time"

	"github.com/triagehq/triage/admission/limit"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/signals"
)

// Defaults.
const (
	// DefaultInterval is how often the execution limit is revisited.
	DefaultInterval = 100 * time.Millisecond
	// DefaultTolerance is how much the mean service time may exceed its
	// recent best before the limit shrinks: 2x, i.e. requests may spend as
	// long waiting for the CPU (or whatever they share) as working.
	DefaultTolerance = 2.0
	// DefaultMaxWait bounds the time a request waits for an execution
	// slot: a request that cannot start within it is better rejected, so
	// that its client retries elsewhere while it still has time.
	DefaultMaxWait = 50 * time.Millisecond
	// DefaultTargetDelay is the mean time admitted requests may wait
	// before their handler starts. In a Go server whose handlers keep the
	// CPU busy, admitted requests queue as runnable goroutines, invisible
	// to any interceptor; this delay is how the controller sees that queue
	// and bounds it (CoDel's 5 ms target).
	DefaultTargetDelay = 5 * time.Millisecond
	// probeEvery is how many intervals pass between baseline probes (5 s
	// at the default interval); a probe runs one interval at the minimum
	// limit.
	probeEvery = 50
	// DefaultMaxLimit bounds the execution limit.
	DefaultMaxLimit = 10000
	// DontRetryRatio: when at least this share of recent requests
	// are retries, rejections say "overloaded; don't retry". Clients' retry
	// budgets keep retries under about 10% of requests even when every
	// task rejects, so a task seeing 5% retries is seeing other tasks
	// reject a large share of their traffic.
	DontRetryRatio = 0.05
	// DefaultMessageTimeout bounds the time from a request's arrival to
	// its Start under SchedulerDelay: for a gRPC unary call, the time its
	// client takes to send the message after its headers. A datacenter
	// client that needs longer is broken, overloaded or hostile.
	DefaultMessageTimeout = 500 * time.Millisecond
	// lateDelays: under SchedulerDelay, a request that reaches Start more
	// than this many target delays after it arrived is late: the server's
	// queue cannot explain the wait, its client was slow to send. It
	// stopped counting towards the pending cap (the prestart ring's epoch
	// is the target delay, four slots), and it ranks below every fresh
	// request of its level.
	lateDelays = prestartSlots
	// DefaultHistoryWindow is the attempt histogram's window.
	DefaultHistoryWindow = 10 * time.Second
	// dontRetryMinRequests is the number of recent requests the histogram
	// needs before it is believed.
	dontRetryMinRequests = 20
	// DefaultQueueFactor is the waiting queue's length as a multiple of
	// the execution limit, plus queueSlack.
	DefaultQueueFactor = 4
	// DefaultMaxStalled is how many requests may be stalled at once
	// (WithMaxStalled).
	DefaultMaxStalled = 4096
	// queueSlack is room in the waiting queue beyond QueueFactor x limit,
	// so that a task at a limit of one still queues a few.
	queueSlack = 8
	// pendingPerLimit bounds the pending cap: at most this many admitted
	// requests per execution slot at the largest limit.
	pendingPerLimit = 8
	// sampleAbove is the number of measured requests per interval above
	// which only one request in sampleMaskHeavy+1 is measured.
	sampleAbove     = 256
	sampleMaskHeavy = 7
	// saturatedAt is the saturation signal's reading from which the CPU
	// counts as saturated and the pending cap applies (WithSaturation):
	// clearly below it, no queue of runnable requests can form.
	saturatedAt = 0.95
)

// Option configures a Controller.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	clock          clock.Clock
	random         func() float64
	obs            []Observer
	interval       time.Duration
	tolerance      float64
	rule           limit.Rule
	minLimit       int
	maxLimit       int
	initialLimit   int
	maxWait        time.Duration
	waitServices   float64
	targetDelay    time.Duration
	queueFactor    int
	historyWindow  time.Duration
	gates          []gate
	delay          DelayMeasure
	messageTimeout time.Duration
	saturation     signals.Signal
	saturationSet  bool
	retryAfterMin  time.Duration
	retryAfterMax  time.Duration
	maxStalled     int
}

type gate struct {
	sig signals.Signal
	th  Thresholds
}

// WithClock sets the clock. Default clock.Real().
func WithClock(c clock.Clock) Option { return optionFunc(func(cfg *config) { cfg.clock = c }) }

// WithRandom sets the uniform [0, 1) source for progressive shedding and
// for choosing which requests are measured, so that a simulation on
// virtual time is reproducible. Default math/rand/v2.
func WithRandom(f func() float64) Option { return optionFunc(func(c *config) { c.random = f }) }

// WithObserver adds observers, each told every Event (to report to two
// exporters at once, say); nil ones are skipped. Default: none.
func WithObserver(obs ...Observer) Option {
	return optionFunc(func(c *config) {
		for _, o := range obs {
			if o != nil {
				c.obs = append(c.obs, o)
			}
		}
	})
}

// WithSignal adds a utilization signal with its per-criticality
// thresholds. A request is rejected by the first signal whose draw says so.
// Default: none; the execution limit alone protects latency. Add CPU,
// Memory, ExecutorLoad or your own.
func WithSignal(s signals.Signal, t Thresholds) Option {
	return optionFunc(func(c *config) { c.gates = append(c.gates, gate{s, t}) })
}

// WithInterval sets how often the execution limit is revisited. Default
// DefaultInterval.
func WithInterval(d time.Duration) Option { return optionFunc(func(c *config) { c.interval = d }) }

// WithTolerance sets how far the mean service time may exceed its recent
// best before the limit shrinks (> 1). Default DefaultTolerance.
func WithTolerance(f float64) Option { return optionFunc(func(c *config) { c.tolerance = f }) }

// WithLimitRule sets the rule that finds the execution limit each
// interval (package limit). The Controller keeps the limit within
// WithLimits' bounds whatever the rule says. Default: limit.Latency, with
// WithLimits' bounds, WithTolerance and a probe every 50 intervals.
func WithLimitRule(r limit.Rule) Option { return optionFunc(func(c *config) { c.rule = r }) }

// WithLimits bounds the execution limit: min, initial and max. Defaults:
// GOMAXPROCS, 2 x GOMAXPROCS, DefaultMaxLimit.
func WithLimits(min, initial, max int) Option {
	return optionFunc(func(c *config) { c.minLimit, c.initialLimit, c.maxLimit = min, initial, max })
}

// WithMaxWait bounds the time a request waits for an execution slot.
// Default DefaultMaxWait. While the task's refusals say "don't retry"
// (many recent requests are retries), a CRITICAL or CRITICAL_PLUS request
// with a deadline waits until its deadline instead, also when that starts
// during its wait: nobody would retry it elsewhere.
func WithMaxWait(d time.Duration) Option { return optionFunc(func(c *config) { c.maxWait = d }) }

// WithMaxWaitServiceTimes also bounds the time a request waits for an
// execution slot by n times the last measured mean service time (in [0,
// 1000]; 0, the default, turns the bound off), once its level's queue has
// stood a whole interval (was not empty at any moment of it; each
// criticality's queue is judged on its own, so that a level the slots
// keep up with is not refused for a queue of less critical requests
// behind it): a request that arrives then waits at most the
// bound, and one that queued before, in what looked like a burst, gives
// up at its next look (at its bound, then once an interval) if it has
// waited longer. A burst at the task's capacity drains within an
// interval and is not refused (CoDel's distinction). In front of a
// service in another process, whose concurrency the limit finds, a
// standing queue of about one service time keeps every slot busy as it
// frees; a longer one adds only waiting. CRITICAL and CRITICAL_PLUS
// requests wait up to three times as long: where they are about all the
// task can serve, the next slots serve them. Intervals without a
// finished request (an idle spell) keep the last measurement; before the
// first, a waiting request looks again once an interval until there is
// one. A level whose queue stands is also served newest first (adaptive
// LIFO): its older requests give up at their bound either way, and those
// served have not waited it out; a level the slots keep up with is served
// in order. A request with a deadline never waits past it.
func WithMaxWaitServiceTimes(n float64) Option {
	return optionFunc(func(c *config) { c.waitServices = n })
}

// WithTargetDelay sets the mean time an admitted request may wait between
// arriving and its handler starting (in the Go run queue and the
// transport, where no interceptor can see it) before the controller admits
// fewer. Default DefaultTargetDelay.
func WithTargetDelay(d time.Duration) Option {
	return optionFunc(func(c *config) { c.targetDelay = d })
}

// WithDelayMeasure sets how the queueing delay that bounds the pending
// cap is measured. Default: SchedulerDelay on the real clock, ArrivalDelay
// under WithClock (the scheduler's latencies are in real time).
func WithDelayMeasure(m DelayMeasure) Option { return optionFunc(func(c *config) { c.delay = m }) }

// WithMessageTimeout bounds, under SchedulerDelay, the time from a
// request's Arrive to its Start: a request that reaches Start later is
// refused (reason Late) before any work. Default DefaultMessageTimeout.
func WithMessageTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.messageTimeout = d })
}

// WithSaturation sets the signal that says how busy the task's CPU is
// (work conservation): while it reads below 0.95 and the mean queueing
// delay is within the max wait (WithMaxWait), the pending cap does not
// shrink, since a task with idle CPU has no queue of runnable requests to
// bound, and while the cap turns requests away it grows each interval by
// four times the idle share of itself (at least a tenth, at most
// doubling: 90% busy, +40%), up to the max wait's worth of requests;
// execution slots, their queue and the deadline still apply. nil turns
// the rule off (the cap follows the delay alone). Default: the CPU the
// process wants against its reservation, sampled every half interval
// (signals.CPUDemand{Interval: WithInterval / 2}), on the real clock;
// none under WithClock.
func WithSaturation(s signals.Signal) Option {
	return optionFunc(func(c *config) { c.saturation, c.saturationSet = s, true })
}

// WithQueueFactor sets the waiting queue's length as a multiple of the
// execution limit (plus 8). Default 4.
func WithQueueFactor(n int) Option { return optionFunc(func(c *config) { c.queueFactor = n }) }

// WithMaxStalled bounds the requests stalled at once (Stall): a request
// that would stall past it keeps its execution slot while it waits on its
// client; 0 stalls none. Default DefaultMaxStalled; at most 2^20.
func WithMaxStalled(n int) Option { return optionFunc(func(c *config) { c.maxStalled = n }) }

// validate refuses a configuration the Controller cannot run with.
func (c *config) validate() error {
	switch {
	case c.interval < time.Millisecond:
		return fmt.Errorf("%w: interval must be at least 1ms, got %v", ErrConfig, c.interval)
	case !(c.tolerance > 1) || math.IsInf(c.tolerance, 0):
		return fmt.Errorf("%w: tolerance must be > 1, got %v", ErrConfig, c.tolerance)
	case c.minLimit < 1 || c.initialLimit < c.minLimit || c.maxLimit < c.initialLimit || c.maxLimit > 1<<20:
		return fmt.Errorf("%w: limits need 1 <= min <= initial <= max <= 2^20, got %d, %d, %d", ErrConfig, c.minLimit, c.initialLimit, c.maxLimit)
	case c.maxWait <= 0:
		return fmt.Errorf("%w: max wait must be positive, got %v", ErrConfig, c.maxWait)
	case !(c.waitServices >= 0 && c.waitServices <= 1000):
		return fmt.Errorf("%w: max wait in service times must be in [0, 1000], got %v", ErrConfig, c.waitServices)
	case c.targetDelay <= 0:
		return fmt.Errorf("%w: target delay must be positive, got %v", ErrConfig, c.targetDelay)
	case c.queueFactor < 0 || c.queueFactor > 64:
		return fmt.Errorf("%w: queue factor must be in [0, 64], got %d", ErrConfig, c.queueFactor)
	case c.maxStalled < 0 || c.maxStalled > 1<<20:
		return fmt.Errorf("%w: max stalled must be in [0, 2^20], got %d", ErrConfig, c.maxStalled)
	case c.messageTimeout <= 0:
		return fmt.Errorf("%w: message timeout must be positive, got %v", ErrConfig, c.messageTimeout)
	case c.delay > ArrivalDelay:
		return fmt.Errorf("%w: unknown delay measure %d", ErrConfig, c.delay)
	}
	if err := c.validateRetryAfter(); err != nil {
		return err
	}
	for _, g := range c.gates {
		if g.sig == nil {
			return fmt.Errorf("%w: nil signal", ErrConfig)
		}
		if err := g.th.validate(); err != nil {
			return err
		}
	}
	return nil
}
