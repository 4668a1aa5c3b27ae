package quota_test

import (
	"fmt"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/quota"
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
	usage, _ := quota.NewUsage(quota.WithUsageClock(clk))
	enf, _ := quota.NewEnforcer(policy, usage, quota.WithCapacity(1), quota.WithEnforcerClock(clk))

	refused := map[string]int{}
	for ms := range 20000 { // 20 s; each request costs 1 ms of CPU
		if ms%5 == 4 { // both send 0.8 CPU: 4 requests every 5 ms
			clk.Advance(time.Millisecond)
			continue
		}
		for _, name := range []string{"search", "batch"} {
			if err := enf.Admit(name, criticality.Sheddable); err != nil {
				refused[name]++
				continue
			}
			usage.Add(name, criticality.Sheddable, time.Millisecond)
		}
		clk.Advance(time.Millisecond)
	}
	fmt.Printf("search refused %d, batch refused some: %v\n", refused["search"], refused["batch"] > 0)
	fmt.Printf("batch uses %.1f CPU (limit 0.2)\n", usage.Total("batch"))
	// Output:
	// search refused 0, batch refused some: true
	// batch uses 0.2 CPU (limit 0.2)
}
