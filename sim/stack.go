package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/retry"
)

// StackConfig configures the stack scenario: SRE book ch. 21, "Deciding to
// Retry" and Figure 21-2. Zero fields take the defaults.
type StackConfig struct {
	// Requests are the user requests sent to the frontend. Default 10,000.
	Requests int
	// DBRejects are the shares of requests the overloaded DB frontend
	// rejects. Default 1 and 0.5.
	DBRejects []float64
	Seed      uint64
}

// stackMode is how the layers behave.
type stackMode struct {
	name   string
	triage bool // layers answer with outcome.Upward: only the layer above the DB retries
	budget bool // the per-client 10% retry budget
}

var stackModes = []stackMode{
	{"retries at every layer", false, false},
	{"triage's rule", true, false},
	{"triage's rule + budget", true, true},
}

// Stack runs the dependency stack of Figure 21-2 (frontend -> backend A ->
// backend B -> DB frontend), each caller with its own retry.Policy (3
// attempts), against a DB frontend that rejects a share of requests as
// overloaded: the attempts that reach the DB per user request. With
// retries at every layer (servers report any failure as "overloaded",
// and every caller retries it) they multiply, 3 x 3 x 3 = 27 (the book's
// "combinatorial"); with triage's rule (a layer that gives up answers
// "overloaded; don't retry", outcome.Upward) only backend B retries, at
// most 3; with the retry budget too, about 1.1.
func Stack(cfg StackConfig) (*Result, error) {
	if cfg.Requests == 0 {
		cfg.Requests = 10000
	}
	if len(cfg.DBRejects) == 0 {
		cfg.DBRejects = []float64{1, 0.5}
	}
	if cfg.Requests < 1 || cfg.Requests > 1_000_000 || len(cfg.DBRejects) > 10 {
		return nil, errors.New("sim: requests in [1, 1000000], at most 10 DB rejection shares")
	}
	for _, r := range cfg.DBRejects {
		if !(r >= 0 && r <= 1) {
			return nil, errors.New("sim: a DB rejection share must be in [0, 1]")
		}
	}
	began := time.Now()
	res := &Result{Scenario: "stack", Seed: cfg.Seed}
	res.Table = [][]string{{"DB rejects", "layers", "DB attempts / user request", "users served"}}
	for _, rej := range cfg.DBRejects {
		for _, m := range stackModes {
			perReq, served, err := runStackCell(cfg, m, rej)
			if err != nil {
				return nil, err
			}
			res.Table = append(res.Table, []string{fmt.Sprintf("%.0f%%", 100*rej), m.name, format(perReq), fmt.Sprintf("%.1f%%", 100*served)})
			h := Headline{Name: fmt.Sprintf("DB attempts per request, DB rejecting %.0f%%, %s", 100*rej, m.name), Value: perReq}
			if rej == 1 {
				switch {
				case !m.triage:
					h.Book, h.Note = book(27), "book: retries at every layer grow combinatorially (3^3 with three callers)"
				case !m.budget:
					h.Book, h.Note = book(3), "book: retry only at the layer directly above the rejecting one"
				default:
					h.Book, h.Note = book(1.1), "with the per-client retry budget"
				}
			}
			res.Headlines = append(res.Headlines, h)
		}
	}
	res.Elapsed = time.Since(began)
	return res, nil
}

// wire is what a response looks like to the caller: an overload outcome
// arrives from downstream.
func wire(err error) error {
	if oe, ok := outcome.As(err); ok {
		c := *oe
		c.Downstream, c.Local = true, false
		return &c
	}
	return err
}

func runStackCell(cfg StackConfig, m stackMode, reject float64) (perReq, served float64, err error) {
	clk := clock.NewFake(time.Unix(0, 0))
	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(reject*1000)+7))
	newPolicy := func() (*retry.Policy, error) {
		opts := []retry.Option{retry.WithClock(clk), retry.WithoutThrottle(), retry.WithBackoff(0, 0), retry.WithRandom(rng.Float64)}
		if !m.budget {
			opts = append(opts, retry.WithoutBudget())
		}
		return retry.New(opts...)
	}
	var fe, a, b *retry.Policy
	if fe, err = newPolicy(); err == nil {
		if a, err = newPolicy(); err == nil {
			b, err = newPolicy()
		}
	}
	if err != nil {
		return 0, 0, err
	}
	dbAttempts := 0
	db := func(context.Context) error {
		dbAttempts++
		if rng.Float64() < reject {
			return wire(&outcome.Error{Kind: outcome.TaskOverloaded, Reason: "db"})
		}
		return nil
	}
	// answer is what a server layer returns for its handler's error.
	answer := func(err error) error {
		if err == nil {
			return nil
		}
		if m.triage {
			return wire(outcome.Upward(err))
		}
		return wire(&outcome.Error{Kind: outcome.TaskOverloaded, Reason: "dependency failed"}) // naive: "overloaded", retry me
	}
	backendB := func(ctx context.Context) error { return answer(b.Do(ctx, db)) }
	backendA := func(ctx context.Context) error { return answer(a.Do(ctx, backendB)) }
	ctx := context.Background()
	ok := 0
	for range cfg.Requests {
		if fe.Do(ctx, backendA) == nil {
			ok++
		}
		clk.Advance(10 * time.Millisecond)
	}
	return float64(dbAttempts) / float64(cfg.Requests), float64(ok) / float64(cfg.Requests), nil
}
