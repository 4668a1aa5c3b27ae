package criticality_test

import (
	"context"
	"fmt"

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
