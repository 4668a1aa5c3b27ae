package subset_test

import (
	"fmt"

	"github.com/triagehq/triage/subset"
)

// A client task picks the backends it connects to: the same backend list,
// in the same order, in every client; its own task index as client id.
func ExampleDeterministic() {
	backends := []string{"b0:443", "b1:443", "b2:443", "b3:443", "b4:443", "b5:443",
		"b6:443", "b7:443", "b8:443", "b9:443", "b10:443", "b11:443"}
	for client := range 4 { // one round: four subsets of three, disjoint
		idx := subset.Deterministic{}.Subset(len(backends), client, 3)
		fmt.Println(client, subset.Of(backends, idx))
	}
	// Output:
	// 0 [b10:443 b8:443 b2:443]
	// 1 [b3:443 b11:443 b0:443]
	// 2 [b7:443 b5:443 b4:443]
	// 3 [b1:443 b9:443 b6:443]
}

// When one backend of 300 leaves, deterministic subsetting changes almost
// every client's subset; ringsteady only those that held it.
func ExampleChurn() {
	for _, a := range []subset.Algorithm{subset.Deterministic{}, subset.Ringsteady{}} {
		fmt.Printf("%s: %.1f%%\n", a.Name(), 100*subset.Churn(a, 300, 300, 10, 150))
	}
	// Output:
	// deterministic: 100.0%
	// ringsteady: 3.3%
}
