package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/criticality"
)

// ShedConfig configures the shed scenario: the CRE post "Using load
// shedding to survive a success disaster", its Procrustean shedder against
// criticality-aware shedding, on the same traffic. Zero fields take the
// defaults.
type ShedConfig struct {
	// Cores is the backend's CPUs; Cost the CPU each request takes.
	// Defaults 4 and 1 ms: a capacity of 4000 requests per second.
	Cores int
	Cost  time.Duration
	// Demands are the offered loads, as multiples of the capacity.
	// Default 1.5, 3 and 10.
	Demands []float64
	// Mix is the share of requests of each criticality, SHEDDABLE first.
	// Default 40% SHEDDABLE, 30% SHEDDABLE_PLUS, 20% CRITICAL, 10%
	// CRITICAL_PLUS: at 3x, the critical classes offer 0.9 of the
	// capacity, what the task is provisioned for (the book: "services
	// provision for all their CRITICAL and CRITICAL_PLUS traffic").
	Mix [criticality.NumLevels]float64
	// Deadline is every request's deadline. Default 1 s.
	Deadline time.Duration
	// Duration is each run's virtual length; goodput is measured over its
	// last two thirds. Default 30 s.
	Duration time.Duration
	Seed     uint64
}

func (c *ShedConfig) defaults() error {
	if c.Cores == 0 {
		c.Cores = 4
	}
	if c.Cost == 0 {
		c.Cost = time.Millisecond
	}
	if len(c.Demands) == 0 {
		c.Demands = []float64{1.5, 3, 10}
	}
	if c.Mix == ([criticality.NumLevels]float64{}) {
		c.Mix = [criticality.NumLevels]float64{0.4, 0.3, 0.2, 0.1}
	}
	if c.Deadline == 0 {
		c.Deadline = time.Second
	}
	if c.Duration == 0 {
		c.Duration = 30 * time.Second
	}
	sum := 0.0
	for _, m := range c.Mix {
		if !(m >= 0) {
			return errors.New("sim: mix shares must be >= 0")
		}
		sum += m
	}
	switch {
	case c.Cores < 1 || c.Cores > 256:
		return errors.New("sim: cores must be in [1, 256]")
	case c.Cost < 10*time.Microsecond || c.Cost > time.Second:
		return errors.New("sim: cost must be between 10us and 1s")
	case sum < 0.999 || sum > 1.001:
		return errors.New("sim: mix shares must sum to 1")
	case c.Deadline < time.Millisecond || c.Deadline > time.Minute:
		return errors.New("sim: deadline must be between 1ms and 1m")
	case c.Duration < 3*time.Second || c.Duration > 10*time.Minute:
		return errors.New("sim: duration must be between 3s and 10m")
	case len(c.Demands) > 10:
		return errors.New("sim: at most 10 demands")
	}
	capacity := float64(c.Cores) / c.Cost.Seconds()
	for _, d := range c.Demands {
		if !(d >= 0.1 && d <= 100) || d*capacity*c.Duration.Seconds() > 10e6 {
			return errors.New("sim: demand must be in [0.1, 100] x capacity, at most 10 million requests a run")
		}
	}
	return nil
}

// The shedders compared.
const (
	shedNone        = "none"        // every request queues, whatever its deadline
	shedProcrustean = "procrustean" // the CRE post's shedder
	shedTriage      = "triage"      // admission.Controller
)

var shedders = []string{shedNone, shedProcrustean, shedTriage}

// shedRow is one (shedder, demand) run: per criticality, requests offered
// and answered in time over the measured part.
type shedRow struct {
	shedder      string
	demand       float64
	offered, ok  [criticality.NumLevels]int
	totalOK      int
	measuredSecs float64
}

func (r *shedRow) goodput(l criticality.Level) float64 {
	if r.offered[l] == 0 {
		return 0
	}
	return float64(r.ok[l]) / float64(r.offered[l])
}

// Shed runs one backend task with Cores CPUs under each demand, first
// unprotected, then with the CRE post's Procrustean shedder (the load is
// the requests in the task; above 25 it drops n of every 10, all of them
// at 45), then with triage's admission.Controller on the same virtual
// clock, and reports the share of each criticality answered within its
// deadline and the goodput as a share of the capacity. The post: the
// Procrustean shedder "assumes that all types of requests and clients are
// equal"; criticality lets the task keep what matters.
func Shed(cfg ShedConfig) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	began := time.Now()
	res := &Result{Scenario: "shed", Seed: cfg.Seed}
	res.Table = [][]string{{"shedder", "demand", "CRITICAL_PLUS", "CRITICAL", "SHEDDABLE_PLUS", "SHEDDABLE", "goodput / capacity"}}
	capacity := float64(cfg.Cores) / cfg.Cost.Seconds()
	rows := map[string]*shedRow{}
	for _, d := range cfg.Demands {
		for _, s := range shedders {
			r, err := runShed(cfg, s, d)
			if err != nil {
				return nil, err
			}
			rows[fmt.Sprint(s, d)] = r
			line := []string{s, format(d) + "x"}
			for _, l := range []criticality.Level{criticality.CriticalPlus, criticality.Critical, criticality.SheddablePlus, criticality.Sheddable} {
				line = append(line, fmt.Sprintf("%.1f%%", 100*r.goodput(l)))
			}
			line = append(line, format(float64(r.totalOK)/r.measuredSecs/capacity))
			res.Table = append(res.Table, line)
		}
	}
	// Headlines at the demand closest to 3x (the mix's design point).
	d := cfg.Demands[0]
	for _, x := range cfg.Demands {
		if math.Abs(x-3) < math.Abs(d-3) {
			d = x
		}
	}
	for _, s := range []string{shedProcrustean, shedTriage} {
		r := rows[fmt.Sprint(s, d)]
		for _, l := range []criticality.Level{criticality.CriticalPlus, criticality.Critical, criticality.SheddablePlus, criticality.Sheddable} {
			res.Headlines = append(res.Headlines, Headline{
				Name:  fmt.Sprintf("%s answered in time, %s, %sx", l, s, format(d)),
				Value: r.goodput(l),
			})
		}
	}
	bars := Plot{Name: "criticality", Title: fmt.Sprintf("answered in time at %sx the capacity", format(d)),
		YLabel: "share answered in time", Categories: []string{"CRITICAL_PLUS", "CRITICAL", "SHEDDABLE_PLUS", "SHEDDABLE"}}
	for _, s := range shedders {
		r := rows[fmt.Sprint(s, d)]
		se := Series{Name: s}
		for _, l := range []criticality.Level{criticality.CriticalPlus, criticality.Critical, criticality.SheddablePlus, criticality.Sheddable} {
			se.Y = append(se.Y, r.goodput(l))
		}
		bars.Series = append(bars.Series, se)
	}
	res.Plots = []Plot{bars}
	for _, s := range shedders {
		r := rows[fmt.Sprint(s, d)]
		res.Headlines = append(res.Headlines, Headline{
			Name: fmt.Sprintf("goodput / capacity, %s, %sx", s, format(d)), Value: float64(r.totalOK) / r.measuredSecs / capacity,
			Note: "requests answered within their deadline",
		})
	}
	res.Elapsed = time.Since(began)
	return res, nil
}

// shedReq is a request in the task: waiting for a CPU (in the run queue,
// as admitted goroutines wait in a Go server) or running.
type shedReq struct {
	arrive, deadline int64
	level            criticality.Level
	ticket           admission.Ticket
}

func runShed(cfg ShedConfig, shedder string, demand float64) (*shedRow, error) {
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(demand*1000)<<8|uint64(len(shedder))))
	vc := &vclock{base: time.Unix(0, 0)}
	var ctl *admission.Controller
	if shedder == shedTriage {
		var err error
		// The controller's smallest execution limit is the task's CPUs, so
		// that a request reaching a free CPU always gets a slot: the
		// simulation's CPUs are the only queue it has not made visible.
		ctl, err = admission.New(admission.WithClock(vc), admission.WithRandom(rng.Float64),
			admission.WithLimits(cfg.Cores, 2*cfg.Cores, 10000))
		if err != nil {
			return nil, err
		}
	}
	capacity := float64(cfg.Cores) / cfg.Cost.Seconds()
	rate := demand * capacity
	cost := int64(cfg.Cost)
	deadline := int64(cfg.Deadline)
	end := int64(cfg.Duration)
	measureFrom := end / 3
	row := &shedRow{shedder: shedder, demand: demand, measuredSecs: float64(end-measureFrom) / 1e9}

	// The run queue is FIFO; the CPUs finish in the order they start (every
	// request costs the same), so running requests form a FIFO too. Both
	// are rings that grow as needed: the unprotected task's queue is the
	// unbounded one the book warns about, bounded here by the run length.
	var queue, running ring[*shedReq]
	free := cfg.Cores
	inTask := 0
	var modulus int64
	var finishAt ring[int64]
	ctx := context.Background()

	finish := func(now int64) {
		r := running.pop()
		finishAt.pop()
		free++
		inTask--
		if ctl != nil {
			ctl.Done(&r.ticket)
		}
		if now <= r.deadline && r.arrive >= measureFrom {
			row.ok[r.level]++
			row.totalOK++
		}
	}
	// startNext gives free CPUs to waiting requests.
	startNext := func(now int64) {
		for free > 0 && queue.len() > 0 {
			r := queue.pop()
			vc.now = now
			if ctl != nil {
				if err := ctl.Start(ctx, &r.ticket); err != nil {
					ctl.Done(&r.ticket) // displaced by a more critical arrival
					inTask--
					continue
				}
			}
			free--
			running.push(r)
			finishAt.push(now + cost)
		}
	}
	now := int64(0)
	for {
		now += int64(rng.ExpFloat64() / rate * 1e9)
		if now >= end {
			break
		}
		for finishAt.len() > 0 && finishAt.peek() <= now {
			t := finishAt.peek()
			finish(t)
			startNext(t)
		}
		vc.now = now
		l := pickLevel(cfg.Mix, rng.Float64())
		if now >= measureFrom {
			row.offered[l]++
		}
		r := &shedReq{arrive: now, deadline: now + deadline, level: l}
		switch shedder {
		case shedProcrustean:
			// The CRE post's addRequest: HARD_QUOTA 45, SOFT_QUOTA 25, STEPS 10.
			const hard, soft, steps = 45, 25, 10
			modulus = (modulus + 1) % steps
			if threshold := int64(float64(hard-inTask) / (float64(hard-soft) / steps)); modulus >= threshold {
				continue
			}
		case shedTriage:
			if err := ctl.Arrive(&r.ticket, l, 0, vc.Now().Add(time.Duration(deadline)), 0); err != nil {
				continue
			}
		}
		inTask++
		queue.push(r)
		startNext(now)
	}
	return row, nil
}

// pickLevel draws a criticality from the mix (SHEDDABLE first).
func pickLevel(mix [criticality.NumLevels]float64, u float64) criticality.Level {
	for l := range criticality.Level(criticality.NumLevels) {
		if u < mix[l] {
			return l
		}
		u -= mix[l]
	}
	return criticality.Level(criticality.NumLevels - 1)
}

// ring is a FIFO that reuses its memory.
type ring[T any] struct {
	buf        []T
	head, size int
}

func (r *ring[T]) len() int { return r.size }

func (r *ring[T]) push(x T) {
	if r.size == len(r.buf) {
		n := make([]T, max(16, 2*len(r.buf)))
		for i := range r.size {
			n[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = n, 0
	}
	r.buf[(r.head+r.size)%len(r.buf)] = x
	r.size++
}

func (r *ring[T]) peek() T { return r.buf[r.head] }

func (r *ring[T]) pop() T {
	var zero T
	x := r.buf[r.head]
	r.buf[r.head] = zero
	r.head = (r.head + 1) % len(r.buf)
	r.size--
	return x
}
