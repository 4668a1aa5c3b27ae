// Package loadtest drives a service with open-loop load to see whether it
// keeps its provisioned rate under overload, the test the CRE post asks
// every team to run on its own shedding ("thoroughly test your logic").
//
// A Runner first finds the service's capacity C (unless told it): a
// closed loop of callers, doubled each probe step until the rate of
// successful calls stops growing, the best rate seen being C. It then
// offers load steps at multiples of C (0.5x to 10x by default) on an open
// loop: calls are sent on schedule whether or not earlier ones have been
// answered, as real traffic arrives, each with a deadline and a
// criticality drawn from a mix. Every call gets exactly one Outcome, and
// each Step reports goodput (successful calls per second against C) by
// criticality, latency percentiles of the successes, and calls by
// outcome. The schedule is OpenLoop, which the drill and the benchmarks
// pace their loads with too.
//
// The transport is the Target's business: triagegrpc.NewLoadTarget calls
// a gRPC method, triagehttp.NewLoadTarget an HTTP URL; both send the
// call's criticality (criticality.NewContext) the way triage's clients do.
// Where the load may go is the caller's business too: CheckLoopback
// refuses targets off this machine, and the triage loadtest command
// applies it unless told otherwise.
//
// Bounds: a run never offers more than its maximum rate, never has more
// than its maximum of calls in flight (a call that would exceed it is not
// sent and is counted NotSent), keeps one sample per call of a step (New
// refuses a maximum rate x step length over MaxCallsPerStep), and New
// refuses a plan longer than the maximum duration. A Runner keeps no state
// between runs; its methods may be called concurrently, each run adding
// its own load.
package loadtest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/measure"
)

// Outcome is the fate of one call.
type Outcome uint8

const (
	// OK is a call that succeeded within its deadline.
	OK Outcome = iota
	// Overloaded is a call the service refused as overloaded (gRPC
	// UNAVAILABLE or RESOURCE_EXHAUSTED, HTTP 429 or 503).
	Overloaded
	// DeadlineExceeded is a call not answered within its deadline.
	DeadlineExceeded
	// Failed is any other error.
	Failed
	// NotSent is a call the generator did not send because it already had
	// its maximum of calls in flight: the run could not keep its schedule.
	NotSent
	// Redirected is a call answered with a redirect, which a load test
	// does not follow: it could lead the load to another host.
	Redirected
)

// NumOutcomes is the number of outcomes; an Outcome indexes a
// [NumOutcomes]T array.
const NumOutcomes = 6

var outcomeNames = [NumOutcomes]string{"ok", "overloaded", "deadline-exceeded", "failed", "not-sent", "redirected"}

// String returns the outcome's name, e.g. "deadline-exceeded".
func (o Outcome) String() string {
	if o < NumOutcomes {
		return outcomeNames[o]
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// A Target makes one call. Call must return when ctx is done (its deadline
// is the call's), and must be safe for concurrent use.
type Target interface {
	Call(ctx context.Context) Outcome
}

// TargetFunc adapts a function to a Target.
type TargetFunc func(ctx context.Context) Outcome

// Call calls f(ctx).
func (f TargetFunc) Call(ctx context.Context) Outcome { return f(ctx) }

// Share is one criticality's weight in the offered load.
type Share struct {
	Level  criticality.Level `json:"criticality"`
	Weight float64           `json:"weight"`
}

// DefaultMix is the overload benchmark's mix: 6% CRITICAL_PLUS, 6%
// CRITICAL, 44% SHEDDABLE_PLUS, 44% SHEDDABLE, so that the critical part
// stays within capacity up to about 8x.
func DefaultMix() []Share {
	return []Share{{criticality.CriticalPlus, 6}, {criticality.Critical, 6}, {criticality.SheddablePlus, 44}, {criticality.Sheddable, 44}}
}

// ParseMix parses "LEVEL:WEIGHT,..." (e.g. "CRITICAL:1" or
// "CRITICAL_PLUS:10,SHEDDABLE:90"); weights are relative.
func ParseMix(s string) ([]Share, error) {
	var mix []Share
	seen := map[criticality.Level]bool{}
	for _, part := range strings.Split(s, ",") {
		name, w, ok := strings.Cut(strings.TrimSpace(part), ":")
		if !ok {
			return nil, fmt.Errorf("loadtest: mix entry %q is not LEVEL:WEIGHT", part)
		}
		l, err := criticality.Parse(name)
		if err != nil {
			return nil, fmt.Errorf("loadtest: mix entry %q: %w", part, err)
		}
		weight, err := strconv.ParseFloat(w, 64)
		if err != nil || !(weight >= 0) || math.IsInf(weight, 0) {
			return nil, fmt.Errorf("loadtest: mix entry %q: weight must be a number >= 0", part)
		}
		if seen[l] {
			return nil, fmt.Errorf("loadtest: mix names %s twice", l)
		}
		seen[l] = true
		mix = append(mix, Share{l, weight})
	}
	return mix, checkMix(mix)
}

func checkMix(mix []Share) error {
	total := 0.0
	for _, s := range mix {
		if !s.Level.Valid() || !(s.Weight >= 0) || math.IsInf(s.Weight, 0) {
			return fmt.Errorf("loadtest: bad mix entry %v:%v", s.Level, s.Weight)
		}
		total += s.Weight
	}
	if !(total > 0) {
		return errors.New("loadtest: the mix has no weight")
	}
	return nil
}

// Limits of a run, and defaults.
const (
	DefaultStep        = 10 * time.Second
	DefaultDeadline    = time.Second
	DefaultProbeStep   = time.Second
	DefaultMaxRate     = 20000 // calls per second
	DefaultMaxInFlight = 10000
	DefaultMaxDuration = 15 * time.Minute
	// MaxCallsPerStep bounds the calls one step may schedule (each keeps a
	// sample of 32 bytes until the step ends).
	MaxCallsPerStep = 2_000_000
	// DefaultProbeWorkers is the most closed-loop callers the capacity
	// probe doubles up to.
	DefaultProbeWorkers = 256
)

// DefaultLoads are the steps, as multiples of the capacity.
func DefaultLoads() []float64 { return []float64{0.5, 1, 2, 5, 10} }

type config struct {
	loads        []float64
	step         time.Duration
	deadline     time.Duration
	mix          []Share
	capacity     float64
	probeStep    time.Duration
	probeWorkers int
	maxRate      float64
	maxInFlight  int
	maxDuration  time.Duration
	clk          clock.Clock
	seed         uint64
	progress     func(string)
}

// Option configures a Runner.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithLoads sets the load steps, as multiples of the capacity (default
// 0.5, 1, 2, 5, 10).
func WithLoads(loads ...float64) Option {
	return optionFunc(func(c *config) { c.loads = slices.Clone(loads) })
}

// WithStep sets how long each load step lasts (default 10 s).
func WithStep(d time.Duration) Option { return optionFunc(func(c *config) { c.step = d }) }

// WithDeadline sets each call's deadline (default 1 s).
func WithDeadline(d time.Duration) Option { return optionFunc(func(c *config) { c.deadline = d }) }

// WithMix sets the criticality mix (default DefaultMix).
func WithMix(mix []Share) Option { return optionFunc(func(c *config) { c.mix = slices.Clone(mix) }) }

// WithCapacity gives the capacity in calls per second, so that the run
// does not probe for it.
func WithCapacity(rps float64) Option { return optionFunc(func(c *config) { c.capacity = rps }) }

// WithProbe sets the capacity probe's step length (default 1 s) and the
// most callers it doubles up to (default 256).
func WithProbe(step time.Duration, maxWorkers int) Option {
	return optionFunc(func(c *config) { c.probeStep, c.probeWorkers = step, maxWorkers })
}

// WithMaxRate bounds the offered rate, in calls per second (default
// 20,000): a step whose multiple of the capacity would exceed it offers
// the maximum, and says so.
func WithMaxRate(rps float64) Option { return optionFunc(func(c *config) { c.maxRate = rps }) }

// WithMaxInFlight bounds the calls in flight (default 10,000).
func WithMaxInFlight(n int) Option { return optionFunc(func(c *config) { c.maxInFlight = n }) }

// WithMaxDuration bounds the planned length of a run (default 15 min).
func WithMaxDuration(d time.Duration) Option {
	return optionFunc(func(c *config) { c.maxDuration = d })
}

// WithClock sets the clock the schedule runs on (default clock.Real).
func WithClock(clk clock.Clock) Option { return optionFunc(func(c *config) { c.clk = clk }) }

// WithSeed sets the seed of the criticality draws (default 1), so that
// two runs offer the same sequence.
func WithSeed(seed uint64) Option { return optionFunc(func(c *config) { c.seed = seed }) }

// WithProgress has the Runner report what it is doing, one line at a time.
func WithProgress(f func(line string)) Option { return optionFunc(func(c *config) { c.progress = f }) }

// Runner runs load tests against one Target.
type Runner struct {
	target Target
	cfg    config
}

// New returns a Runner for t, or an error naming the first bad option.
func New(t Target, opts ...Option) (*Runner, error) {
	if t == nil {
		return nil, errors.New("loadtest: no target")
	}
	c := config{
		loads: DefaultLoads(), step: DefaultStep, deadline: DefaultDeadline, mix: DefaultMix(),
		probeStep: DefaultProbeStep, probeWorkers: DefaultProbeWorkers, maxRate: DefaultMaxRate,
		maxInFlight: DefaultMaxInFlight, maxDuration: DefaultMaxDuration, seed: 1,
	}
	for _, o := range opts {
		o.apply(&c)
	}
	c.clk = clock.OrReal(c.clk)
	switch {
	case len(c.loads) == 0:
		return nil, errors.New("loadtest: no load steps")
	case c.step <= 0:
		return nil, fmt.Errorf("loadtest: step length %v must be positive", c.step)
	case c.deadline <= 0:
		return nil, fmt.Errorf("loadtest: deadline %v must be positive", c.deadline)
	case c.probeStep <= 0 || c.probeWorkers < 1:
		return nil, fmt.Errorf("loadtest: probe step %v and workers %d must be positive", c.probeStep, c.probeWorkers)
	case !(c.maxRate > 0) || math.IsInf(c.maxRate, 0):
		return nil, fmt.Errorf("loadtest: maximum rate %v must be a positive number", c.maxRate)
	case c.maxInFlight < 1:
		return nil, fmt.Errorf("loadtest: maximum in flight %d must be positive", c.maxInFlight)
	case c.capacity < 0 || math.IsNaN(c.capacity) || math.IsInf(c.capacity, 0):
		return nil, fmt.Errorf("loadtest: capacity %v must be a positive number (or 0 to probe)", c.capacity)
	case c.probeWorkers > c.maxInFlight:
		return nil, fmt.Errorf("loadtest: probe workers %d exceed the maximum in flight %d", c.probeWorkers, c.maxInFlight)
	}
	for _, l := range c.loads {
		if !(l > 0) || math.IsInf(l, 0) {
			return nil, fmt.Errorf("loadtest: load step %v must be a positive multiple of the capacity", l)
		}
	}
	if err := checkMix(c.mix); err != nil {
		return nil, err
	}
	if calls := c.maxRate * c.step.Seconds(); calls > MaxCallsPerStep {
		return nil, fmt.Errorf("loadtest: a step could schedule %.0f calls (maximum rate x step length), over the %d a step may hold; lower one of them", calls, MaxCallsPerStep)
	}
	if plan := c.plannedDuration(); plan > c.maxDuration {
		return nil, fmt.Errorf("loadtest: the run would last up to %v, over its maximum of %v", plan, c.maxDuration)
	}
	return &Runner{target: t, cfg: c}, nil
}

// plannedDuration is the longest a run can take: every probe step (one per
// doubling of the callers, plus two to see the rate stop growing), every
// load step, and a deadline after each for the last calls.
func (c *config) plannedDuration() time.Duration {
	var d time.Duration
	if c.capacity == 0 {
		doublings := bitsLen(c.probeWorkers) + 1
		d += time.Duration(doublings) * (c.probeStep + c.deadline)
	}
	return d + time.Duration(len(c.loads))*(c.step+c.deadline)
}

func bitsLen(n int) int {
	b := 0
	for ; n > 0; n >>= 1 {
		b++
	}
	return b
}

func (r *Runner) say(format string, args ...any) {
	if r.cfg.progress != nil {
		r.cfg.progress(fmt.Sprintf(format, args...))
	}
}

// Run finds the capacity (unless given) and runs every load step. It
// returns what it measured so far with ctx's error when ctx ends early.
func (r *Runner) Run(ctx context.Context) (*Result, error) {
	res := &Result{DeadlineMS: ms(r.cfg.deadline), Mix: r.cfg.mix, Capacity: r.cfg.capacity}
	if res.Capacity == 0 {
		c, probe, err := r.Capacity(ctx)
		res.Probe = probe
		if err != nil {
			return res, err
		}
		res.Capacity, res.CapacityProbed = c, true
	}
	for i, load := range r.cfg.loads {
		rate := load * res.Capacity
		capped := rate > r.cfg.maxRate
		rate = min(rate, r.cfg.maxRate)
		r.say("step %.2gx: %.0f calls/s for %v", load, rate, r.cfg.step)
		st := r.step(ctx, rate, r.cfg.step, r.cfg.seed, uint64(i))
		st.Load, st.RateCapped = load, capped
		st.finish(res.Capacity, r.cfg.mix)
		res.Steps = append(res.Steps, st)
		r.say("  goodput %.2f of C, p99 %.0f ms, %s", st.Goodput, st.Latency.P99, st.outcomeLine())
		if err := ctx.Err(); err != nil {
			return res, err
		}
	}
	return res, nil
}

// Capacity probes the capacity: closed-loop callers, 1, 2, 4, ... up to
// the probe's maximum, each for one probe step, until the rate of calls
// that succeed stops growing by 5% for two steps in a row, or a step is
// past the capacity (more than 5% of its calls fail, or its median
// latency passes half the deadline). It returns the best rate of
// successes of the steps within the capacity, and every probe step.
func (r *Runner) Capacity(ctx context.Context) (float64, []ProbePoint, error) {
	var points []ProbePoint
	var pr probe
	for w := 1; w <= r.cfg.probeWorkers; w *= 2 {
		p := r.closedLoop(ctx, w, r.cfg.probeStep)
		points = append(points, p)
		r.say("probe: %d callers: %.0f successes/s, p50 %.1f ms, %.1f%% failed", w, p.OKPerSecond, p.P50MS, 100*p.FailedFraction)
		if err := ctx.Err(); err != nil {
			return pr.best, points, err
		}
		if pr.done(p, r.cfg.deadline) {
			break
		}
	}
	best := pr.best
	if best <= 0 {
		last := points[len(points)-1]
		return 0, points, fmt.Errorf("loadtest: the probe found no rate the service sustains (with %d callers, %.0f%% of calls failed and the median took %.0f ms); check the target, or give the capacity", last.Workers, 100*last.FailedFraction, last.P50MS)
	}
	return best, points, nil
}

// probe is the capacity probe's decision.
type probe struct {
	best float64
	flat int // steps in a row that did not raise best by 5%
}

// done takes one probe step and reports whether the probe is over: the
// step is past the capacity (over 5% of its calls failed, or its median
// passed half the deadline; its rate does not count), or the rate has not
// grown by 5% for two steps in a row.
func (pr *probe) done(p ProbePoint, deadline time.Duration) bool {
	if p.FailedFraction > 0.05 || p.P50MS > ms(deadline)/2 {
		return true
	}
	if p.OKPerSecond > pr.best*1.05 {
		pr.flat = 0
	} else {
		pr.flat++
	}
	pr.best = max(pr.best, p.OKPerSecond)
	return pr.flat >= 2
}

// ProbePoint is one step of the capacity probe.
type ProbePoint struct {
	Workers        int     `json:"workers"`
	OKPerSecond    float64 `json:"ok_per_second"`
	P50MS          float64 `json:"p50_ms"`
	FailedFraction float64 `json:"failed_fraction"`
}

// closedLoop runs w callers for d, each calling again as soon as its last
// call returns, at the mix's criticalities.
func (r *Runner) closedLoop(ctx context.Context, w int, d time.Duration) ProbePoint {
	clk := r.cfg.clk
	start := clk.Now()
	end := start.Add(d)
	var mu sync.Mutex
	var lat []float64
	var ok, total int
	var wg sync.WaitGroup
	for i := range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(r.cfg.seed, uint64(1000+i)))
			for ctx.Err() == nil {
				t0 := clk.Now()
				if !t0.Before(end) {
					return
				}
				cctx, cancel := context.WithTimeout(criticality.NewContext(ctx, pick(r.cfg.mix, rng.Float64())), r.cfg.deadline)
				o := r.target.Call(cctx)
				cancel()
				t1 := clk.Now()
				mu.Lock()
				total++
				if o == OK {
					ok++
					lat = append(lat, ms(t1.Sub(t0)))
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := clk.Now().Sub(start)
	p := ProbePoint{Workers: w}
	if elapsed > 0 {
		p.OKPerSecond = float64(ok) / elapsed.Seconds()
	}
	if total > 0 {
		p.FailedFraction = float64(total-ok) / float64(total)
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		p.P50MS = measure.Quantile(lat, 0.5)
	}
	return p
}

// pick draws a criticality from mix for u in [0, 1).
func pick(mix []Share, u float64) criticality.Level {
	total := 0.0
	for _, s := range mix {
		total += s.Weight
	}
	x := u * total
	for _, s := range mix {
		if x < s.Weight {
			return s.Level
		}
		x -= s.Weight
	}
	for i := len(mix) - 1; i >= 0; i-- {
		if mix[i].Weight > 0 {
			return mix[i].Level
		}
	}
	return criticality.Critical
}

// sample is one scheduled call's fate.
type sample struct {
	at      time.Duration // scheduled send time since the step's start
	latency time.Duration // answer time - scheduled send time
	lag     time.Duration // actual send time - scheduled send time
	level   criticality.Level
	outcome Outcome
}

// step offers rate calls per second for d on an open loop: call i is sent
// at i/rate whatever happened to the earlier ones.
func (r *Runner) step(ctx context.Context, rate float64, d time.Duration, seed, stream uint64) Step {
	n := int(rate * d.Seconds())
	samples := make([]sample, n)
	rng := rand.New(rand.NewPCG(seed, stream))
	at := Every(rate, d)
	for i := range samples {
		samples[i].at, _ = at(i)
		samples[i].level = pick(r.cfg.mix, rng.Float64())
	}
	clk := r.cfg.clk
	sched := OpenLoop{Clock: clk, MaxInFlight: r.cfg.maxInFlight,
		Skip: func(i int, lag time.Duration) { samples[i].lag, samples[i].outcome = lag, NotSent }}
	paced := sched.Run(ctx, at, func(i int, lag time.Duration) func() {
		s := &samples[i]
		s.lag = lag
		return func() {
			sent := clk.Now()
			cctx, cancel := context.WithTimeout(criticality.NewContext(ctx, s.level), r.cfg.deadline-s.lag)
			s.outcome = r.target.Call(cctx)
			cancel()
			s.latency = s.lag + clk.Now().Sub(sent) // from the scheduled time
		}
	})
	scheduled := paced.Sent + paced.Skipped
	length := d
	if scheduled < n {
		length = time.Duration(float64(scheduled) / rate * float64(time.Second))
	}
	return summarize(samples[:scheduled], rate, length)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
