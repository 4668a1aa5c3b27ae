package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/triagehq/triage/quota/allocate"
	"github.com/triagehq/triage/quota/usage"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/quota"
)

// ThrottlingConfig configures the Throttling scenario. Zero fields take
// the defaults in brackets.
type ThrottlingConfig struct {
	Tasks    int           // tasks serving the customer [4]
	Limit    float64       // the customer's global hard limit, CPU-seconds per second [2]
	Surge    float64       // demand during the surge, as a multiple of Limit [3]
	Cost     time.Duration // mean CPU per request (each drawn in [0.5, 1.5] of it) [2ms]
	Refresh  time.Duration // how often each task renews its lease [1s]
	Duration time.Duration // virtual length of each run [60s]
	Seed     uint64
}

func (c *ThrottlingConfig) defaults() error {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Tasks, 4)
	if c.Limit == 0 {
		c.Limit = 2
	}
	if c.Surge == 0 {
		c.Surge = 3
	}
	if c.Cost == 0 {
		c.Cost = 2 * time.Millisecond
	}
	if c.Refresh == 0 {
		c.Refresh = time.Second
	}
	if c.Duration == 0 {
		c.Duration = time.Minute
	}
	switch {
	case c.Tasks < 2 || c.Tasks > 64:
		return errors.New("sim: throttling: tasks must be in [2, 64]")
	case !(c.Limit >= 0.01 && c.Limit <= 1000):
		return errors.New("sim: throttling: limit must be in [0.01, 1000]")
	case !(c.Surge >= 1 && c.Surge <= 100):
		return errors.New("sim: throttling: surge must be in [1, 100]")
	case c.Cost < 10*time.Microsecond || c.Cost > 100*time.Millisecond:
		return errors.New("sim: throttling: cost must be in [10us, 100ms]")
	case c.Refresh < 100*time.Millisecond || c.Refresh > 30*time.Second:
		return errors.New("sim: throttling: refresh must be in [100ms, 30s]")
	case c.Duration < 20*time.Second || c.Duration > 10*time.Minute:
		return errors.New("sim: throttling: duration must be in [20s, 10m]")
	}
	return nil
}

// throttlingRun is one mode's run: the customer's global usage, summed
// over every task, per 1 s window, with the demand offered.
type throttlingRun struct {
	mode   quota.Mode
	usage  []float64 // CPU-seconds used in window i
	demand []float64 // CPU-seconds per second offered in window i
	// slidingMax is the most CPU used in any 1 s window starting on a
	// 10 ms boundary.
	slidingMax float64
}

// Throttling is the CRE post's "Optimistic and pessimistic throttling" on
// virtual time, with triage's quota.Enforcer, quota.Leased and
// allocate.Allocator: one customer with a global hard limit, served by Tasks
// tasks that renew their leases every Refresh. The customer's demand is
// half the limit, spread evenly, for the first sixth of the run; then
// Surge times the limit, all on the first half of the tasks; at half-time
// it moves to the other half; for the last sixth it is half the limit
// again, spread evenly. Each mode runs on the same traffic. A request's
// CPU counts in the 1 s window in which it completes (it runs on a core
// of its own, from its admission for its cost).
func Throttling(cfg ThrottlingConfig) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	began := time.Now()
	res := &Result{Scenario: "throttling", Seed: cfg.Seed}
	runs := []*throttlingRun{}
	for _, m := range []quota.Mode{quota.ModeOptimistic, quota.ModePessimistic} {
		r, err := runThrottling(cfg, m)
		if err != nil {
			return nil, err
		}
		runs = append(runs, r)
	}
	res.Table = [][]string{{"mode", "peak 1 s window / limit", "peak sliding 1 s / limit", "windows over the limit", "unused capacity while demand > limit", "served / demand"}}
	plot := Plot{Name: "usage", Title: "the customer's global usage per 1 s window", XLabel: "time (s)", YLabel: "CPU-seconds per second"}
	for _, r := range runs {
		peak, over, unused, served, offered, n := 0.0, 0, 0.0, 0.0, 0.0, 0
		se := Series{Name: r.mode.String()}
		for i, u := range r.usage {
			se.X = append(se.X, float64(i+1))
			se.Y = append(se.Y, u)
			peak = max(peak, u)
			if u > cfg.Limit*(1+1e-9) {
				over++
			}
			served += u
			offered += r.demand[i]
			if r.demand[i] > cfg.Limit*1.2 && i > 0 && r.demand[i-1] > cfg.Limit*1.2 {
				unused += max(0, cfg.Limit-u) / cfg.Limit
				n++
			}
		}
		if n > 0 {
			unused /= float64(n)
		}
		plot.Series = append(plot.Series, se)
		res.Table = append(res.Table, []string{r.mode.String(), format(peak / cfg.Limit), format(r.slidingMax / cfg.Limit),
			fmt.Sprintf("%d of %d", over, len(r.usage)), fmt.Sprintf("%.1f%%", 100*unused), format(served / offered)})
		res.Headlines = append(res.Headlines,
			Headline{Name: "peak 1 s usage / limit, " + r.mode.String(), Value: peak / cfg.Limit,
				Note: "the post: optimistic spikes over the global maximum, pessimistic never does"},
			Headline{Name: "peak sliding 1 s usage / limit, " + r.mode.String(), Value: r.slidingMax / cfg.Limit},
			Headline{Name: "1 s windows over the limit, " + r.mode.String(), Value: float64(over)},
			Headline{Name: "unused capacity while demand exceeds the limit, " + r.mode.String(), Value: unused,
				Note: "share of the limit left unused in windows of steady surge"})
	}
	limit := Series{Name: "limit"}
	demand := Series{Name: "demand"}
	for i := range runs[0].usage {
		limit.X, limit.Y = append(limit.X, float64(i+1)), append(limit.Y, cfg.Limit)
		demand.X, demand.Y = append(demand.X, float64(i+1)), append(demand.Y, runs[0].demand[i])
	}
	plot.Series = append(plot.Series, limit, demand)
	res.Plots = []Plot{plot}
	res.Elapsed = time.Since(began)
	return res, nil
}

const throttlingCustomer = "bulk"

// throttlingTask is one task: its usage, lease and enforcer, and the
// requests it is running.
type throttlingTask struct {
	name    string
	usage   *usage.Table
	leased  *quota.Leased
	enf     *quota.Enforcer
	next    time.Duration // next lease refresh
	acc     float64       // fractional arrivals owed
	running ring[throttlingReq]
}

type throttlingReq struct {
	end int64 // ns since the start
	res quota.Reservation
	cpu time.Duration
}

func runThrottling(cfg ThrottlingConfig, mode quota.Mode) (*throttlingRun, error) {
	clk := clock.NewFake(time.Unix(0, 0))
	pol, err := quota.New(quota.Config{Tasks: cfg.Tasks, Fallback: quota.Safe,
		Customers: map[string]quota.Limit{throttlingCustomer: {CPU: cfg.Limit, Hard: true}}})
	if err != nil {
		return nil, err
	}
	alloc, err := allocate.New(pol, allocate.WithClock(clk), allocate.WithMode(mode),
		allocate.WithRefresh(cfg.Refresh), allocate.WithLease(10*cfg.Refresh))
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x7407))
	tasks := make([]*throttlingTask, cfg.Tasks)
	for i := range tasks {
		u, err := usage.New(usage.WithClock(clk))
		if err != nil {
			return nil, err
		}
		leased := quota.NewLeased(clk, pol)
		enf, err := quota.NewEnforcer(leased, u, quota.WithMode(mode),
			quota.WithEnforcerRandom(rng.Float64))
		if err != nil {
			return nil, err
		}
		tasks[i] = &throttlingTask{name: fmt.Sprintf("task-%d", i), usage: u, leased: leased, enf: enf,
			next: time.Duration(i) * cfg.Refresh / time.Duration(cfg.Tasks)}
	}
	const step = time.Millisecond
	windows := int(cfg.Duration / time.Second)
	run := &throttlingRun{mode: mode, usage: make([]float64, windows), demand: make([]float64, windows)}
	fine := make([]float64, windows*100) // CPU per 10 ms, for the sliding maximum
	half := cfg.Tasks / 2
	calm, surgeEnd := cfg.Duration/6, cfg.Duration-cfg.Duration/6
	for now := time.Duration(0); now < cfg.Duration; now += step {
		ns := int64(now)
		// Demand per task, CPU-seconds per second.
		perTask := func(i int) float64 {
			switch {
			case now < calm || now >= surgeEnd:
				return cfg.Limit / 2 / float64(cfg.Tasks)
			case now < cfg.Duration/2:
				if i < half {
					return cfg.Surge * cfg.Limit / float64(half)
				}
			default:
				if i >= half {
					return cfg.Surge * cfg.Limit / float64(cfg.Tasks-half)
				}
			}
			return 0
		}
		w := int(now / time.Second)
		for i, t := range tasks {
			if now >= t.next {
				snap := t.usage.Snapshot()
				for j := range snap {
					snap[j].Share = t.leased.Share(snap[j].Customer)
				}
				ls, err := alloc.Refresh(quota.Report{Task: t.name, Customers: snap})
				if err != nil {
					return nil, err
				}
				if err := t.leased.Set(ls); err != nil {
					return nil, err
				}
				t.next += cfg.Refresh
			}
			// Completions.
			for t.running.len() > 0 && t.running.peek().end <= ns {
				q := t.running.pop()
				t.enf.Done(throttlingCustomer, criticality.Sheddable, q.res, q.cpu)
				if k := int((q.end - 1) / int64(time.Second)); k < windows {
					run.usage[k] += q.cpu.Seconds()
				}
				if k := int((q.end - 1) / int64(10*time.Millisecond)); k < len(fine) {
					fine[k] += q.cpu.Seconds()
				}
			}
			d := perTask(i)
			run.demand[w] += d * step.Seconds()
			t.acc += d * step.Seconds() / cfg.Cost.Seconds()
			for ; t.acc >= 1; t.acc-- {
				res, err := t.enf.Reserve(throttlingCustomer, criticality.Sheddable)
				if err != nil {
					continue
				}
				cpu := time.Duration(float64(cfg.Cost) * (0.5 + rng.Float64()))
				t.running.push(throttlingReq{end: ns + int64(cpu), res: res, cpu: cpu})
			}
		}
		clk.Advance(step)
	}
	for i := 0; i+100 <= len(fine); i++ {
		var s float64
		for _, v := range fine[i : i+100] {
			s += v
		}
		run.slidingMax = max(run.slidingMax, s)
	}
	for i := range run.usage {
		run.usage[i] = math.Round(run.usage[i]*1e6) / 1e6
	}
	return run, nil
}
