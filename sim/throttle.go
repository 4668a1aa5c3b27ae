package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/throttle"
)

// ThrottleConfig configures the throttle scenario: SRE book ch. 21,
// "Client-Side Throttling". Zero fields take the defaults.
type ThrottleConfig struct {
	// Ks are the throttles' K. Default 1.1, 2 and 4.
	Ks []float64
	// Demands are the clients' demand in multiples of the backend's
	// capacity. Default 2, 10 and 100.
	Demands []float64
	// Capacity is what the backend accepts per second. Default 500.
	Capacity float64
	// Clients share the demand evenly. Default 10.
	Clients int
	// Overload is how long each cell runs in overload; the ratios are
	// taken over its last minute. Default 3 minutes (the throttle's
	// window is the book's two minutes).
	Overload time.Duration
	// Uncapped uses the book's formula without triage's cap on the
	// local rejection probability (0.95 by default).
	Uncapped bool
	Seed     uint64
}

func (c *ThrottleConfig) defaults() error {
	if len(c.Ks) == 0 {
		c.Ks = []float64{1.1, 2, 4}
	}
	if len(c.Demands) == 0 {
		c.Demands = []float64{2, 10, 100}
	}
	if c.Capacity == 0 {
		c.Capacity = 500
	}
	if c.Clients == 0 {
		c.Clients = 10
	}
	if c.Overload == 0 {
		c.Overload = 3 * time.Minute
	}
	switch {
	case len(c.Ks) > 10 || len(c.Demands) > 10:
		return errors.New("sim: at most 10 values of K and of demand")
	case c.Capacity < 1 || c.Capacity > 10000 || c.Clients < 1 || c.Clients > 1000:
		return errors.New("sim: capacity must be in [1, 10000] per second and clients in [1, 1000]")
	case c.Overload < 70*time.Second || c.Overload > time.Hour:
		return errors.New("sim: overload must be between 70 s and 1 h")
	}
	for _, d := range c.Demands {
		if !(d >= 0.1 && d <= 1000) || d*c.Capacity > 1e6 {
			return errors.New("sim: demand must be in [0.1, 1000] x capacity, at most 1e6 requests per second")
		}
	}
	for _, k := range c.Ks {
		if !(k >= 1 && k <= 100) {
			return errors.New("sim: K must be in [1, 100]")
		}
	}
	return nil
}

// throttleCell is one (K, demand) run.
type throttleCell struct {
	k, demand                    float64
	sent, accepted, local, total float64 // over the last minute of overload
	recovery                     time.Duration
}

// Throttle runs clients using throttle.Throttle against one backend that
// accepts Capacity requests per second and rejects the rest, for every K
// and demand: the backend's rejections per acceptance in steady overload
// (the book: about K-1, "the backend rejects about one request per
// request it accepts" at K = 2), and, when the demand then drops to half
// the capacity, how long the clients take to stop rejecting locally.
func Throttle(cfg ThrottleConfig) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	began := time.Now()
	res := &Result{Scenario: "throttle", Seed: cfg.Seed}
	res.Table = [][]string{{"K", "demand", "backend rejects/accepts", "rejected locally", "recovery s"}}
	cells := make(map[[2]float64]*throttleCell)
	for _, k := range cfg.Ks {
		for _, d := range cfg.Demands {
			c, err := runThrottleCell(cfg, k, d)
			if err != nil {
				return nil, err
			}
			cells[[2]float64{k, d}] = c
			res.Table = append(res.Table, []string{format(k), format(d) + "x", format(c.ratio()),
				fmt.Sprintf("%.1f%%", 100*c.local/c.total), fmt.Sprintf("%.1f", c.recovery.Seconds())})
		}
	}
	for _, k := range cfg.Ks {
		for _, d := range cfg.Demands {
			c := cells[[2]float64{k, d}]
			h := Headline{Name: fmt.Sprintf("rejects per accept, K=%s, %sx", format(k), format(d)), Value: c.ratio()}
			if !cfg.Uncapped && d > 1/(1-throttle.DefaultMaxRejectProbability) {
				h.Note = "triage caps local rejection at 95%: the backend sees at least demand/20"
			} else {
				h.Book = book(math.Round((min(k, d)-1)*1000) / 1000)
				h.Note = "book: the backend receives K times what it accepts (at most the demand)"
			}
			res.Headlines = append(res.Headlines, h)
		}
	}
	// The book's equilibrium is a client's: with several clients sharing
	// one backend the aggregate falls below K-1 at modest overload
	// (docs/rationale.md, "K at modest overload"). One client shows it.
	if cfg.Clients > 1 {
		one := cfg
		one.Clients = 1
		for _, k := range cfg.Ks {
			c, err := runThrottleCell(one, k, 2)
			if err != nil {
				return nil, err
			}
			res.Headlines = append(res.Headlines, Headline{Name: fmt.Sprintf("rejects per accept, K=%s, 2x, one client", format(k)), Value: c.ratio(),
				Book: book(math.Round((min(k, 2)-1)*1000) / 1000), Note: "the book's equilibrium, per client; several clients sharing the backend settle lower"})
		}
	}
	for _, k := range cfg.Ks {
		worst := time.Duration(0)
		for _, d := range cfg.Demands {
			worst = max(worst, cells[[2]float64{k, d}].recovery)
		}
		res.Headlines = append(res.Headlines, Headline{
			Name: fmt.Sprintf("recovery seconds, K=%s", format(k)), Value: worst.Seconds(),
			Note: "time until clients stop rejecting locally once demand falls to half the capacity (worst demand)",
		})
	}
	res.Elapsed = time.Since(began)
	return res, nil
}

func (c *throttleCell) ratio() float64 {
	if c.accepted == 0 {
		return 0
	}
	return (c.sent - c.accepted) / c.accepted
}

const simStep = 10 * time.Millisecond

func runThrottleCell(cfg ThrottleConfig, k, demand float64) (*throttleCell, error) {
	clk := clock.NewFake(time.Unix(0, 0))
	seed := cfg.Seed ^ uint64(k*1000)<<20 ^ uint64(demand*1000)
	rng := rand.New(rand.NewPCG(seed, 0x7472696167))
	opts := []throttle.Option{throttle.WithK(k), throttle.WithClock(clk), throttle.WithRandom(rng.Float64)}
	if cfg.Uncapped {
		opts = append(opts, throttle.WithMaxRejectProbability(1))
	}
	clients := make([]*throttle.Throttle, cfg.Clients)
	for i := range clients {
		t, err := throttle.New(opts...)
		if err != nil {
			return nil, err
		}
		clients[i] = t
	}
	c := &throttleCell{k: k, demand: demand}
	stepSec := simStep.Seconds()
	credit := make([]float64, cfg.Clients)
	for i := range credit {
		credit[i] = rng.Float64() // clients out of phase
	}
	// The backend accepts Capacity per second, in bursts of up to a tenth
	// of a second's worth.
	var tokens float64
	burst := max(1, 0.1*cfg.Capacity)
	steps := int(cfg.Overload / simStep)
	measureFrom := steps - int(time.Minute/simStep)
	recoverySteps := int(2 * time.Minute / simStep)
	recoveredAt := -1
	for s := 0; s < steps+recoverySteps; s++ {
		recovering := s >= steps
		rate := demand * cfg.Capacity / float64(cfg.Clients)
		if recovering {
			rate = 0.5 * cfg.Capacity / float64(cfg.Clients)
		}
		tokens = min(tokens+cfg.Capacity*stepSec, burst)
		var offered, local float64
		now := clk.Now()
		first := rng.IntN(len(clients)) // arrivals interleave: no client is always first
		for j := range clients {
			i := (first + j) % len(clients)
			t := clients[i]
			credit[i] += rate * stepSec
			for ; credit[i] >= 1; credit[i]-- {
				offered++
				tk, ok := t.AllowAt(criticality.Default, now)
				if !ok {
					local++
					continue
				}
				accepted := tokens >= 1
				if accepted {
					tokens--
				}
				tk.Done(accepted)
				if s >= measureFrom && !recovering {
					c.sent++
					if accepted {
						c.accepted++
					}
				}
			}
		}
		if s >= measureFrom && !recovering {
			c.total += offered
			c.local += local
		}
		if recovering && recoveredAt < 0 && offered > 0 && local == 0 {
			// recovered once a whole second passes without a local rejection
			recoveredAt = s
		} else if recovering && local > 0 {
			recoveredAt = -1
		}
		if recovering && recoveredAt >= 0 && s-recoveredAt >= int(time.Second/simStep) {
			break
		}
		clk.Advance(simStep)
	}
	if recoveredAt < 0 {
		recoveredAt = steps + recoverySteps
	}
	c.recovery = time.Duration(recoveredAt-steps) * simStep
	return c, nil
}
