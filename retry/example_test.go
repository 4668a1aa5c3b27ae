package retry_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/triagehq/triage/attempt"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/retry"
)

// A request whose backend answers "task overloaded" twice is retried with
// backoff and succeeds on its third attempt. The next request, always
// refused, finds the client's retry budget (retries under 10% of requests,
// past a small allowance) spent by the first, and is given up at once as
// "overloaded; don't retry", so that the layer above does not retry it
// again. Errors that are not overload
// are never retried.
func Example() {
	pol, err := retry.New(retry.WithBackoff(time.Millisecond, 5*time.Millisecond)) // default 5 ms to 1 s
	if err != nil {
		log.Fatal(err)
	}
	ctx := criticality.NewContext(context.Background(), criticality.Critical)
	err = pol.Do(ctx, func(ctx context.Context) error {
		n := attempt.Outgoing(ctx) // 0, 1, 2: triage's clients send it to the backend
		if n < 2 {
			return outcome.New(outcome.TaskOverloaded, "busy")
		}
		fmt.Println("served on attempt", n)
		return nil
	})
	fmt.Println(err)

	err = pol.Do(ctx, func(context.Context) error { return outcome.New(outcome.TaskOverloaded, "busy") })
	fmt.Println(errors.Is(err, outcome.ErrDontRetry), err)
	// Output:
	// served on attempt 2
	// <nil>
	// true triage: overloaded; don't retry (retry budget exhausted)
}
