package quota

import (
	"fmt"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
)

// BenchmarkEnforcerAdmit: a soft-limited customer on an overloaded task,
// admitted or refused (the refusal allocates nothing).
func BenchmarkEnforcerAdmit(b *testing.B) {
	p, _ := New(Config{Customers: map[string]Limit{"ads": {CPU: 0.001}}})
	u, _ := NewUsage()
	e, _ := NewEnforcer(p, u, WithOverload(func() bool { return true }))
	u.Add("ads", criticality.Sheddable, time.Second)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			e.Admit("ads", criticality.Sheddable)
		}
	})
}

// BenchmarkAllocatorRefresh: one refresh of a task reporting 1,000
// customers, at a leader holding 1,000 such tasks of a 10,000-customer
// policy (bench/cmd/quotascale measures the same over gRPC).
func BenchmarkAllocatorRefresh(b *testing.B) {
	const tasks, customers, perTask = 1000, 10000, 1000
	cs := make(map[string]Limit, customers)
	name := func(i int) string { return fmt.Sprintf("customer-%d", i) }
	for i := range customers {
		cs[name(i)] = Limit{CPU: 0.01 * float64(1+i%10)}
	}
	p, err := New(Config{Tasks: tasks, Customers: cs})
	if err != nil {
		b.Fatal(err)
	}
	clk := clock.NewFake(time.Unix(0, 0))
	a, err := NewAllocator(p, WithClock(clk), WithLease(15*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	reports := make([]Report, tasks)
	for i := range reports {
		r := Report{Task: fmt.Sprintf("task-%d", i), Customers: make([]CustomerUsage, perTask)}
		first := i * customers / tasks
		for j := range perTask {
			c := (first + j) % customers
			d := 0.001 * float64(1+(c+i)%7)
			r.Customers[j] = CustomerUsage{Customer: name(c), Demand: d, Used: [criticality.NumLevels]float64{2: d}}
		}
		reports[i] = r
	}
	for _, r := range reports {
		a.Refresh(r)
	}
	clk.Advance(16 * time.Second) // past learning
	for _, r := range reports {
		a.Refresh(r)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%tasks == 0 {
			clk.Advance(5 * time.Millisecond)
		}
		if _, err := a.Refresh(reports[i%tasks]); err != nil {
			b.Fatal(err)
		}
	}
}
