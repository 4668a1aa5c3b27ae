package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/throttle"
)

// CascadeConfig configures the cascade scenario: SRE book ch. 21 (and ch.
// 22): tasks provisioned near their capacity lose some of their number;
// the load moves to the rest. Zero fields take the defaults.
type CascadeConfig struct {
	// Tasks is the backend tasks; Lost how many die at LoseAt, for good.
	// Defaults 10, 3 and 20 s.
	Tasks, Lost int
	LoseAt      time.Duration
	// Cores and Cost make each task's capacity: defaults 4 CPUs and 1 ms
	// per request, 4000 requests per second.
	Cores int
	Cost  time.Duration
	// Load is the demand as a share of all tasks' capacity. Default 0.8:
	// after losing 3 of 10, the 7 left get 1.14x their capacity.
	Load float64
	// Clients send the requests, round robin over the live tasks.
	// Default 50.
	Clients int
	// Deadline is each attempt's deadline. Default 1 s.
	Deadline time.Duration
	// Duration is the run's virtual length. Default 60 s.
	Duration time.Duration
	Seed     uint64
}

const (
	// cascadeMemory is how many requests an unprotected task can hold
	// before it runs out of memory and crashes (4 s of work at the
	// default capacity); it comes back empty after cascadeRestart.
	cascadeMemory  = 16000
	cascadeRestart = int64(10 * time.Second)
)

func (c *CascadeConfig) defaults() error {
	if c.Tasks == 0 {
		c.Tasks = 10
	}
	if c.Lost == 0 {
		c.Lost = 3
	}
	if c.LoseAt == 0 {
		c.LoseAt = 20 * time.Second
	}
	if c.Cores == 0 {
		c.Cores = 4
	}
	if c.Cost == 0 {
		c.Cost = time.Millisecond
	}
	if c.Load == 0 {
		c.Load = 0.8
	}
	if c.Clients == 0 {
		c.Clients = 50
	}
	if c.Deadline == 0 {
		c.Deadline = time.Second
	}
	if c.Duration == 0 {
		c.Duration = time.Minute
	}
	switch {
	case c.Tasks < 2 || c.Tasks > 100 || c.Lost < 0 || c.Lost >= c.Tasks:
		return errors.New("sim: tasks must be in [2, 100] and lost in [0, tasks)")
	case c.Cores < 1 || c.Cores > 64 || c.Cost < 100*time.Microsecond || c.Cost > time.Second:
		return errors.New("sim: cores must be in [1, 64] and cost between 100us and 1s")
	case !(c.Load > 0 && c.Load <= 2):
		return errors.New("sim: load must be in (0, 2]")
	case c.Clients < 1 || c.Clients > 1000:
		return errors.New("sim: clients must be in [1, 1000]")
	case c.Deadline < 10*time.Millisecond || c.Deadline > time.Minute:
		return errors.New("sim: deadline must be between 10ms and 1m")
	case c.Duration < 10*time.Second || c.Duration > 10*time.Minute || c.LoseAt < 3*time.Second || c.LoseAt > c.Duration*2/3:
		return errors.New("sim: duration must be between 10s and 10m, and lose-at between 3s and two thirds of it")
	}
	capacity := float64(c.Tasks*c.Cores) / c.Cost.Seconds()
	if c.Load*capacity*c.Duration.Seconds() > 20e6 {
		return errors.New("sim: at most 20 million requests a run")
	}
	return nil
}

// cascadeRun is one run's outcome.
type cascadeRun struct {
	protected bool
	// goodput per second (requests answered within the deadline, any
	// attempt), and attempts sent per second
	goodput, attempts []float64
	crashes           int
	// after is the goodput over the last third of the run as a share of
	// the surviving tasks' capacity; before, over the seconds before the
	// loss as a share of the demand.
	after, before float64
}

// Cascade runs the same traffic twice. Unprotected: tasks queue whatever
// comes (until memory runs out and they crash, to come back empty ten
// seconds later), and clients retry any failure up to 3 attempts at once.
// With triage: each task runs an admission.Controller, and each client
// triage's adaptive throttling and retry budget (only "task overloaded" is
// retried). The book: without protection "the failure in a subset of a
// system ... might trigger the failure of other system components";
// with it, each task "should continue to serve traffic at that rate".
func Cascade(cfg CascadeConfig) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	began := time.Now()
	res := &Result{Scenario: "cascade", Seed: cfg.Seed}
	var runs [2]*cascadeRun
	for i, protected := range []bool{false, true} {
		r, err := runCascade(cfg, protected)
		if err != nil {
			return nil, err
		}
		runs[i] = r
	}
	res.Table = [][]string{{"second", "goodput unprotected", "attempts unprotected", "goodput triage", "attempts triage"}}
	for s := range runs[0].goodput {
		res.Table = append(res.Table, []string{fmt.Sprint(s), format(runs[0].goodput[s]), format(runs[0].attempts[s]),
			format(runs[1].goodput[s]), format(runs[1].attempts[s])})
	}
	for _, r := range runs {
		name := "unprotected"
		if r.protected {
			name = "triage"
		}
		res.Headlines = append(res.Headlines,
			Headline{Name: "goodput after the loss, share of the survivors' capacity, " + name, Value: r.after,
				Note: fmt.Sprintf("last third of the run, %d of %d tasks left", cfg.Tasks-cfg.Lost, cfg.Tasks)},
			Headline{Name: "task crashes, " + name, Value: float64(r.crashes)},
		)
	}
	res.Headlines = append(res.Headlines, Headline{Name: "goodput before the loss, share of demand, triage", Value: runs[1].before})
	secs := make([]float64, len(runs[0].goodput))
	for i := range secs {
		secs[i] = float64(i)
	}
	res.Plots = []Plot{{
		Name: "goodput", Title: fmt.Sprintf("%d of %d tasks lost at %v", cfg.Lost, cfg.Tasks, cfg.LoseAt),
		XLabel: "second", YLabel: "requests answered in time per second",
		Series: []Series{{Name: "unprotected", X: secs, Y: runs[0].goodput}, {Name: "triage", X: secs, Y: runs[1].goodput}},
	}, {
		Name: "attempts", Title: "attempts sent (retries included)", XLabel: "second", YLabel: "attempts per second",
		Series: []Series{{Name: "unprotected", X: secs, Y: runs[0].attempts}, {Name: "triage", X: secs, Y: runs[1].attempts}},
	}}
	res.Elapsed = time.Since(began)
	return res, nil
}

// retryable reports whether an admission rejection invites a retry: "task
// overloaded" does, "overloaded; don't retry" does not.
func retryable(err error) bool {
	_, dontRetry, ok := admission.RejectionOf(err)
	return ok && !dontRetry
}

// cascadeAttempt is one attempt of a user request on a task.
type cascadeAttempt struct {
	req      *cascadeReq
	task     int
	deadline int64
	done     bool // answered, failed or timed out: the client has moved on
	ticket   admission.Ticket
}

type cascadeReq struct {
	client   int
	arrive   int64
	attempts int
	ok       bool
}

type cascadeTask struct {
	dead      bool  // lost for good
	downUntil int64 // crashed until then
	queue     ring[*cascadeAttempt]
	running   ring[*cascadeAttempt]
	finishAt  ring[int64]
	free      int
	ctl       *admission.Controller
}

// drop loses every request the task holds (it died or crashed): those the
// client still waits for fail at once, as a broken connection would.
func (t *cascadeTask) drop(now int64, fail func(now int64, a *cascadeAttempt, overloaded bool)) {
	for _, q := range []*ring[*cascadeAttempt]{&t.queue, &t.running} {
		for q.len() > 0 {
			if a := q.pop(); !a.done {
				fail(now, a, false)
			}
		}
	}
	for t.finishAt.len() > 0 {
		t.finishAt.pop()
	}
}

type cascadeClient struct {
	rr     int
	thr    *throttle.Throttle
	budget *retry.Budget
}

func runCascade(cfg CascadeConfig, protected bool) (*cascadeRun, error) {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x636173))
	vc := &vclock{base: time.Unix(0, 0)}
	tasks := make([]*cascadeTask, cfg.Tasks)
	for i := range tasks {
		t := &cascadeTask{free: cfg.Cores}
		if protected {
			var err error
			t.ctl, err = admission.New(admission.WithClock(vc), admission.WithRandom(rng.Float64),
				admission.WithLimits(cfg.Cores, 2*cfg.Cores, 10000))
			if err != nil {
				return nil, err
			}
		}
		tasks[i] = t
	}
	clients := make([]*cascadeClient, cfg.Clients)
	for i := range clients {
		c := &cascadeClient{rr: i % cfg.Tasks}
		if protected {
			var err error
			if c.thr, err = throttle.New(throttle.WithClock(vc), throttle.WithRandom(rng.Float64)); err != nil {
				return nil, err
			}
			if c.budget, err = retry.NewBudget(0.1, time.Minute, vc); err != nil {
				return nil, err
			}
		}
		clients[i] = c
	}
	seconds := int(cfg.Duration / time.Second)
	run := &cascadeRun{protected: protected, goodput: make([]float64, seconds), attempts: make([]float64, seconds)}
	capacity := float64(cfg.Tasks*cfg.Cores) / cfg.Cost.Seconds()
	rate := cfg.Load * capacity
	cost, deadline := int64(cfg.Cost), int64(cfg.Deadline)
	loseAt, end := int64(cfg.LoseAt), int64(cfg.Duration)
	var pending ring[*cascadeAttempt] // by deadline (attempts are sent in time order)
	ctx := criticality.NewContext(context.Background(), criticality.Critical)

	var send func(now int64, r *cascadeReq, retry bool)
	// fail is a failed attempt (rejected, or lost in a crash): the client
	// may retry.
	fail := func(now int64, a *cascadeAttempt, overloaded bool) {
		a.done = true
		c := clients[a.req.client]
		if protected {
			if !overloaded || a.req.attempts >= 3 || !c.budget.TryRetry(criticality.Critical) {
				return
			}
		} else if a.req.attempts >= 3 {
			return
		}
		send(now, a.req, true)
	}
	second := func(t int64) int { return min(int(t/int64(time.Second)), seconds-1) }
	startNext := func(now int64, t *cascadeTask) {
		for t.free > 0 && t.queue.len() > 0 {
			a := t.queue.pop()
			if t.ctl != nil {
				vc.now = now
				if err := t.ctl.Start(ctx, &a.ticket); err != nil {
					t.ctl.Done(&a.ticket)
					if !a.done {
						fail(now, a, retryable(err))
					}
					continue
				}
			}
			t.free--
			t.running.push(a)
			t.finishAt.push(now + cost)
		}
	}
	crash := func(now int64, t *cascadeTask) {
		run.crashes++
		t.downUntil = now + cascadeRestart
		t.drop(now, fail)
		t.free = cfg.Cores
	}
	send = func(now int64, r *cascadeReq, isRetry bool) {
		c := clients[r.client]
		// Round robin over the tasks that are up (a client sees a dead or
		// crashed task's connection fail and skips it).
		var t *cascadeTask
		ti := -1
		for k := range len(tasks) {
			i := (c.rr + k) % len(tasks)
			if x := tasks[i]; !x.dead && now >= x.downUntil {
				t, ti = x, i
				c.rr = i + 1
				break
			}
		}
		if t == nil {
			return // nothing is up: the request fails
		}
		var tk throttle.Ticket
		if protected {
			if !isRetry {
				c.budget.Request()
			}
			var ok bool
			if tk, ok = c.thr.AllowAt(criticality.Critical, vc.Now()); !ok {
				return // throttled locally: overloaded; don't retry
			}
		}
		r.attempts++
		run.attempts[second(now)]++
		a := &cascadeAttempt{req: r, task: ti, deadline: now + deadline}
		if protected {
			vc.now = now
			err := t.ctl.Arrive(&a.ticket, criticality.Critical, r.attempts-1, vc.Now().Add(time.Duration(deadline)), 0)
			tk.Done(err == nil)
			if err != nil {
				fail(now, a, retryable(err))
				return
			}
		}
		pending.push(a)
		t.queue.push(a)
		if !protected && t.queue.len()+t.running.len() > cascadeMemory {
			crash(now, t)
			return
		}
		startNext(now, t)
	}
	// nextFinish returns the task whose next request finishes first.
	nextFinish := func() (*cascadeTask, int64) {
		var best *cascadeTask
		at := int64(1<<63 - 1)
		for _, t := range tasks {
			if t.finishAt.len() > 0 && t.finishAt.peek() < at {
				best, at = t, t.finishAt.peek()
			}
		}
		return best, at
	}
	lost := false
	now := int64(0)
	for {
		now += int64(rng.ExpFloat64() / rate * 1e9)
		if now >= end {
			break
		}
		// Everything due before this arrival: completions and timeouts,
		// in time order.
		for {
			t, at := nextFinish()
			var to int64 = 1<<63 - 1
			if pending.len() > 0 {
				to = pending.peek().deadline
			}
			if at > now && to > now {
				break
			}
			if to < at {
				if a := pending.pop(); !a.done {
					// The client gives up; an unprotected task still has
					// the work queued. Naive clients retry a timeout;
					// triage's do not (it is not "task overloaded").
					a.done = true
					if !protected && a.req.attempts < 3 {
						send(to, a.req, true)
					}
				}
				continue
			}
			a := t.running.pop()
			t.finishAt.pop()
			t.free++
			if t.ctl != nil {
				t.ctl.Done(&a.ticket)
			}
			if !a.done && at <= a.deadline {
				a.done = true
				if !a.req.ok {
					a.req.ok = true
					run.goodput[second(a.req.arrive)]++
				}
			}
			startNext(at, t)
		}
		vc.now = now
		if !lost && now >= loseAt {
			lost = true
			for _, t := range tasks[:cfg.Lost] {
				t.dead = true
				t.drop(now, fail)
			}
		}
		send(now, &cascadeReq{client: rng.IntN(cfg.Clients), arrive: now}, false)
	}
	perTask := float64(cfg.Cores) / cfg.Cost.Seconds()
	survivors := float64(cfg.Tasks-cfg.Lost) * perTask
	from := seconds * 2 / 3
	var sum float64
	for _, g := range run.goodput[from : seconds-1] { // the last second is cut by the run's end
		sum += g
	}
	run.after = sum / float64(seconds-1-from) / survivors
	lostSec := int(cfg.LoseAt / time.Second)
	sum = 0
	for _, g := range run.goodput[2:lostSec] {
		sum += g
	}
	run.before = sum / float64(lostSec-2) / rate
	return run, nil
}
