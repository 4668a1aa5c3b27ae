package criticality_test

import (
	"context"
	"testing"

	"github.com/triagehq/triage/criticality"
)

var sinkLevel criticality.Level

// BenchmarkFromContext reads the level through a realistic context chain.
func BenchmarkFromContext(b *testing.B) {
	ctx := criticality.NewContext(context.Background(), criticality.SheddablePlus)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b.ReportAllocs()
	for b.Loop() {
		sinkLevel = criticality.Of(ctx)
	}
}

// BenchmarkNewContext/same is propagation with no override (the common case);
// /override attaches a new level, which costs the one context node that any
// context.WithValue costs.
func BenchmarkNewContext(b *testing.B) {
	parent := criticality.NewContext(context.Background(), criticality.Critical)
	b.Run("same", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sinkLevel = criticality.Of(criticality.NewContext(parent, criticality.Critical))
		}
	})
	b.Run("override", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sinkLevel = criticality.Of(criticality.NewContext(parent, criticality.Sheddable))
		}
	})
}

func BenchmarkParse(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		sinkLevel, _ = criticality.Parse("SHEDDABLE_PLUS")
	}
}
