package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/triagehq/triage/criticality"
)

// recoverySecond is one second of the recovery scenario after the overload.
type recoverySecond struct {
	Second  int     `json:"second"`
	Success float64 `json:"success"`
	P99ms   float64 `json:"p99_ms"`
}

type recoveryReport struct {
	Variant     string           `json:"variant"`
	BeforeP99ms float64          `json:"before_p99_ms"`
	During      result           `json:"during_10x"`
	After       []recoverySecond `json:"after"`
}

func recovery(ctx context.Context, cfg config, c float64, variant string) (recoveryReport, error) {
	rr := recoveryReport{Variant: variant}
	b, err := startBackend(cfg, variant)
	if err != nil {
		return rr, err
	}
	defer b.stop()
	ccs, _, closeAll, err := dial(cfg, b, variant)
	if err != nil {
		return rr, err
	}
	defer closeAll()
	mix := []share{{criticality.Critical, 1}}
	pre := openLoop(ctx, ccs, 0.5*c, 10*time.Second, cfg.deadline, mix, 1)
	rr.BeforeP99ms = ms(summarize(pre, 5*time.Second, 10*time.Second).p99)
	over := openLoop(ctx, ccs, 10*c, 30*time.Second, cfg.deadline, mix, 2)
	s := summarize(over, 15*time.Second, 30*time.Second)
	rr.During = result{Variant: variant, Load: 10, Goodput: s.goodputRPS / c, P50ms: ms(s.p50), P99ms: ms(s.p99), Sent: over.sent, Completed: over.done, Valid: over.lagOver == 0}
	post := openLoop(ctx, ccs, 0.5*c, 15*time.Second, cfg.deadline, mix, 3)
	for sec := 0; sec < 15; sec++ {
		x := summarize(post, time.Duration(sec)*time.Second, time.Duration(sec+1)*time.Second)
		succ := 0.0
		if x.offered > 0 {
			succ = float64(x.ok) / float64(x.offered)
		}
		rr.After = append(rr.After, recoverySecond{Second: sec, Success: succ, P99ms: ms(x.p99)})
	}
	fmt.Fprintf(os.Stderr, "  recovery %s: before p99 %.1f ms, during 10x goodput %.2f\n", variant, rr.BeforeP99ms, rr.During.Goodput)
	return rr, nil
}
