package criticality_test

import (
	"context"
	"fmt"
	"time"

	"github.com/triagehq/triage/criticality"
)

// A handler serving a CRITICAL request issues a prefetch that may be shed
// first: it overrides the criticality for that call only.
func ExampleNewContext() {
	ctx := criticality.NewContext(context.Background(), criticality.Critical)
	prefetch := criticality.NewContext(ctx, criticality.Sheddable)
	fmt.Println(criticality.Of(ctx), criticality.Of(prefetch))
	fmt.Println(criticality.Sheddable < criticality.Critical)
	// Output:
	// CRITICAL SHEDDABLE
	// true
}

func ExampleParse() {
	l, err := criticality.Parse("SHEDDABLE_PLUS")
	fmt.Println(l, err)
	l, err = criticality.Parse("critical")
	fmt.Println(l, err != nil)
	// Output:
	// SHEDDABLE_PLUS <nil>
	// CRITICAL true
}

// The front page is CRITICAL for its first 2 s, then worth no more than
// SHEDDABLE (the CRE post's "Criticality changes over time"). The edge
// starts the decay (an edge rule's decay: {after: 2s, to: SHEDDABLE});
// queues and the next hops see the current level.
func ExampleWithDecay() {
	arrived := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	ctx := criticality.NewContext(context.Background(), criticality.Critical)
	ctx = criticality.WithDecay(ctx, criticality.Decay{At: arrived.Add(2 * time.Second), To: criticality.Sheddable})

	for _, waited := range []time.Duration{500 * time.Millisecond, 2 * time.Second} {
		now := arrived.Add(waited)
		l, decayed := criticality.Current(ctx, now)
		d, _ := criticality.DecayOf(ctx)
		fmt.Printf("after %v: %v (decayed %v), sent on as %q\n", waited, l, decayed, criticality.FormatDecay(d, now))
	}
	// Output:
	// after 500ms: CRITICAL (decayed false), sent on as "1500:SHEDDABLE"
	// after 2s: SHEDDABLE (decayed true), sent on as ""
}
