package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/retry"
)

// RetryConfig configures the retry scenario: SRE book ch. 21, "Deciding
// to Retry" and Figure 21-1. Zero fields take the defaults.
type RetryConfig struct {
	// Clients each send Requests requests, one every 100 ms of virtual
	// time, to a random backend, retrying on another random backend.
	// Defaults 100, 1000 and 100.
	Clients, Requests, Backends int
	Seed                        uint64
}

func (c *RetryConfig) defaults() error {
	if c.Clients == 0 {
		c.Clients = 100
	}
	if c.Requests == 0 {
		c.Requests = 1000
	}
	if c.Backends == 0 {
		c.Backends = 100
	}
	if c.Clients < 1 || c.Clients > 10000 || c.Requests < 1 || c.Requests > 100000 || c.Backends < 1 || c.Backends > 10000 ||
		c.Clients*c.Requests > 10_000_000 {
		return errors.New("sim: clients and backends in [1, 10000], requests in [1, 100000], at most 10 million requests")
	}
	return nil
}

// retrySituation is one of the book's situations: the share of backend
// tasks that are overloaded (they reject every request as task
// overloaded; the others accept all).
type retrySituation struct {
	name       string
	overloaded float64
}

var retrySituations = []retrySituation{
	{"healthy", 0}, {"a few tasks overloaded", 0.1}, {"most tasks overloaded", 0.9}, {"all tasks overloaded", 1},
}

// Retry runs clients using retry.Policy (three attempts, throttling off to
// isolate retries) with and without the per-client retry budget (retries
// under 10% of requests), in the book's situations: how many attempts
// each initial request costs the backends (without the budget up to 3x,
// the book's "3X"; with it about 1.1x), and the histogram of attempt
// numbers the backends see (Figure 21-1: retries stand out only when many
// tasks are overloaded).
func Retry(cfg RetryConfig) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	began := time.Now()
	res := &Result{Scenario: "retry", Seed: cfg.Seed}
	res.Table = [][]string{{"situation", "budget", "attempts/request", "attempt 0", "attempt 1", "attempt 2", "succeeded"}}
	growth := map[[2]string]float64{}
	for _, sit := range retrySituations {
		for _, budget := range []bool{false, true} {
			hist, perReq, ok, err := runRetryCell(cfg, sit, budget)
			if err != nil {
				return nil, err
			}
			b := "none"
			if budget {
				b = "10%"
			}
			growth[[2]string{sit.name, b}] = perReq
			total := float64(hist[0] + hist[1] + hist[2])
			res.Table = append(res.Table, []string{sit.name, b, format(perReq),
				fmt.Sprintf("%.1f%%", 100*float64(hist[0])/total), fmt.Sprintf("%.1f%%", 100*float64(hist[1])/total),
				fmt.Sprintf("%.1f%%", 100*float64(hist[2])/total), fmt.Sprintf("%.1f%%", 100*ok)})
		}
	}
	res.Headlines = []Headline{
		{Name: "attempts per request, all overloaded, no budget", Value: growth[[2]string{"all tasks overloaded", "none"}], Book: book(3),
			Note: "book: retries grow load up to 3x"},
		{Name: "attempts per request, all overloaded, 10% budget", Value: growth[[2]string{"all tasks overloaded", "10%"}], Book: book(1.1),
			Note: "book: a per-client retry budget of 10% caps growth near 1.1x"},
		{Name: "attempts per request, a few overloaded, 10% budget", Value: growth[[2]string{"a few tasks overloaded", "10%"}],
			Note: "a few bad tasks: retries go elsewhere and succeed"},
		{Name: "attempts per request, healthy", Value: growth[[2]string{"healthy", "10%"}], Book: book(1)},
	}
	res.Elapsed = time.Since(began)
	return res, nil
}

var errOverloaded = &outcome.Error{Kind: outcome.TaskOverloaded, Reason: "simulated"}

// runRetryCell returns the backends' histogram of attempt numbers, the
// attempts per initial request, and the share of requests that succeeded.
func runRetryCell(cfg RetryConfig, sit retrySituation, budget bool) (hist [attempt.MaxAttempts]int, perReq, succeeded float64, err error) {
	clk := clock.NewFake(time.Unix(0, 0))
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(sit.overloaded*1000)+1))
	overloaded := make([]bool, cfg.Backends)
	for _, i := range rng.Perm(cfg.Backends)[:int(sit.overloaded*float64(cfg.Backends)+0.5)] {
		overloaded[i] = true
	}
	policies := make([]*retry.Policy, cfg.Clients)
	for i := range policies {
		opts := []retry.Option{retry.WithClock(clk), retry.WithoutThrottle(), retry.WithBackoff(0, 0), retry.WithRandom(rng.Float64)}
		if !budget {
			opts = append(opts, retry.WithoutBudget())
		}
		if policies[i], err = retry.New(opts...); err != nil {
			return hist, 0, 0, err
		}
	}
	call := func(ctx context.Context) error {
		hist[attempt.Outgoing(ctx)]++
		if overloaded[rng.IntN(cfg.Backends)] {
			return errOverloaded
		}
		return nil
	}
	ctx := context.Background()
	var ok int
	for range cfg.Requests {
		for _, p := range policies {
			if p.Do(ctx, call) == nil {
				ok++
			}
		}
		clk.Advance(100 * time.Millisecond)
	}
	n := float64(cfg.Clients * cfg.Requests)
	return hist, float64(hist[0]+hist[1]+hist[2]) / n, float64(ok) / n, nil
}
