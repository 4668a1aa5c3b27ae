package balance_test

import (
	"fmt"

	"github.com/triagehq/triage/balance"
)

// Least-loaded round robin over the book's example subset: new requests go
// to the backends with the fewest active requests, in turn.
func ExampleBalancer() {
	b, _ := balance.New(balance.WithPolicy(balance.LeastLoaded))
	eps, _ := b.SetEndpoints([]string{"t0", "t1", "t2"})
	for _, e := range eps {
		e.SetState(balance.Healthy) // the adapter reports connections
	}
	busy, _ := b.Pick() // one request in flight on some backend
	for range 2 {
		e, _ := b.Pick()
		fmt.Println(e != busy, e.Active())
	}
	busy.Done(false)
	// Output:
	// true 1
	// true 1
}
