package quota_test

import (
	"fmt"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/quota/usage"
)

// A task provisioned for 1 CPU-second per second, shared by a customer
// within its quota and one sending four times its quota: while the task
// is overloaded, only the second is refused, and it is held near its
// limit.
func ExampleEnforcer() {
	clk := clock.NewFake(time.Unix(0, 0))
	policy, err := quota.New(quota.Config{Customers: map[string]quota.Limit{
		"search": {CPU: 0.9},
		"batch":  {CPU: 0.2},
	}})
	if err != nil {
		panic(err)
	}
	table, _ := usage.New(usage.WithClock(clk))
	enf, _ := quota.NewEnforcer(policy, table, quota.WithCapacity(1))

	refused := map[string]int{}
	for ms := range 20000 { // 20 s; each request costs 1 ms of CPU
		if ms%5 == 4 { // both send 0.8 CPU: 4 requests every 5 ms
			clk.Advance(time.Millisecond)
			continue
		}
		for _, name := range []string{"search", "batch"} {
			r, err := enf.Reserve(name, criticality.Sheddable)
			if err != nil {
				refused[name]++
				continue
			}
			enf.Done(name, criticality.Sheddable, r, time.Millisecond)
		}
		clk.Advance(time.Millisecond)
	}
	fmt.Printf("search refused %d, batch refused some: %v\n", refused["search"], refused["batch"] > 0)
	fmt.Printf("batch uses %.1f CPU (limit 0.2)\n", table.Total("batch"))
	// Output:
	// search refused 0, batch refused some: true
	// batch uses 0.2 CPU (limit 0.2)
}

// Pessimistic throttling: the customer's hard limit of 0.5 CPU-seconds per
// second is held ahead of its usage, so that no second of a sudden burst
// at 10x the limit goes over it. Each request reserves the customer's
// expected cost when admitted (Reserve) and settles its real cost when done
// (Done).
func ExampleWithMode() {
	clk := clock.NewFake(time.Unix(0, 0))
	policy, _ := quota.New(quota.Config{Customers: map[string]quota.Limit{"batch": {CPU: 0.5, Hard: true}}})
	table, _ := usage.New(usage.WithClock(clk))
	enf, _ := quota.NewEnforcer(policy, table, quota.WithMode(quota.ModePessimistic))

	worst := 0.0
	for range 5 { // 5 s of 5 CPU-seconds per second offered, in 1 ms requests
		used := 0.0
		for range 1000 {
			for range 5 {
				r, err := enf.Reserve("batch", criticality.Sheddable)
				if err != nil {
					continue
				}
				enf.Done("batch", criticality.Sheddable, r, time.Millisecond)
				used += 0.001
			}
			clk.Advance(time.Millisecond)
		}
		worst = max(worst, used)
	}
	fmt.Printf("busiest second: %.2f CPU-seconds (limit 0.5)\n", worst)
	// Output:
	// busiest second: 0.45 CPU-seconds (limit 0.5)
}
