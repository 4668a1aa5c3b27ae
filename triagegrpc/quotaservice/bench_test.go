package quotaservice

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/triagehq/triage/quota/allocate"

	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotapb"
)

// BenchmarkServiceRefresh: one refresh as the service sees it off the
// wire (decode the report, Allocator.Refresh, encode the lease) of a task
// reporting 1,000 customers, at a leader holding 1,000 such tasks of a
// 10,000-customer policy (bench/cmd/quotascale measures it over gRPC).
func BenchmarkServiceRefresh(b *testing.B) {
	const tasks, customers, perTask = 1000, 10000, 1000
	cs := make(map[string]quota.Limit, customers)
	name := func(i int) string { return fmt.Sprintf("customer-%d", i) }
	for i := range customers {
		cs[name(i)] = quota.Limit{CPU: 0.01 * float64(1+i%10)}
	}
	p, err := quota.New(quota.Config{Tasks: tasks, Customers: cs})
	if err != nil {
		b.Fatal(err)
	}
	a, err := allocate.New(p, allocate.WithLease(time.Hour), allocate.WithRefresh(time.Second))
	if err != nil {
		b.Fatal(err)
	}
	s := NewService(a)
	wire := make([][]byte, tasks)
	for i := range tasks {
		req := &quotapb.RefreshRequest{Task: fmt.Sprintf("task-%d", i)}
		first := i * customers / tasks
		for j := range perTask {
			c := (first + j) % customers
			d := 0.001 * float64(1+(c+i)%7)
			req.Customers = append(req.Customers, &quotapb.CustomerUsage{Customer: name(c), Used: []float64{0, 0, d, 0}, Demand: d})
		}
		wire[i] = req.Marshal()
	}
	refresh := func(i int) {
		var req quotapb.RefreshRequest
		if err := req.Unmarshal(wire[i%tasks]); err != nil {
			b.Fatal(err)
		}
		resp, err := s.Refresh(context.Background(), &req)
		if err != nil {
			b.Fatal(err)
		}
		_ = resp.Marshal()
	}
	for i := range tasks {
		refresh(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		refresh(i)
	}
}
