package retry_test

import (
	"context"
	"testing"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/retry"
)

// BenchmarkBudget is the per-client retry budget: /request is the
// bookkeeping every request pays, /tryretry the check a retry pays (each
// reads the monotonic clock once); run with -cpu 1,2.
func BenchmarkBudget(b *testing.B) {
	bg, err := retry.NewBudget(retry.DefaultRatio, retry.DefaultBudgetWindow, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("request", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				bg.Request()
			}
		})
	})
	b.Run("tryretry", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				bg.TryRetry(criticality.Critical)
			}
		})
	})
}

// BenchmarkDo is one request through a Policy with the defaults
// (throttle, budget) whose call succeeds at once: the whole client-side
// bookkeeping of a request, one clock read included.
func BenchmarkDo(b *testing.B) {
	p, err := retry.New()
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	ok := func(context.Context) error { return nil }
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = p.Do(ctx, ok)
		}
	})
}
