package quotaservice_test

import (
	"context"
	"math"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/internal/loopback"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagegrpc/quotaservice"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotapb"
)

func quotaServer(t testing.TB, c quota.Config, opts ...quota.AllocatorOption) (addr string, a *quota.Allocator) {
	t.Helper()
	p, err := quota.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if a, err = quota.NewAllocator(p, opts...); err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(quotapb.ServerOption())
	quotapb.RegisterQuotaServer(gs, quotaservice.NewService(a))
	return loopback.ServeGRPC(t, gs), a
}

// Two tasks report over loopback; each gets its share of a customer's
// limit by where the customer's demand lands, and a malformed report is
// refused with INVALID_ARGUMENT.
func TestQuotaServiceOverLoopback(t *testing.T) {
	clk := clock.NewFake(time.Now())
	addr, _ := quotaServer(t, quota.Config{Customers: map[string]quota.Limit{"ads": {CPU: 4}}, Tasks: 2},
		quota.WithLease(10*time.Second), quota.WithRefresh(time.Second), quota.WithAllocatorClock(clk))
	clk.Advance(10 * time.Second) // past learning mode
	cc := loopback.DialGRPC(t, addr, quotaservice.DialOptions(time.Second)...)
	type task struct {
		u *quota.Usage
		l *quota.Leased
		c *quotaservice.Client
	}
	var tasks []task
	for i, name := range []string{"task-a", "task-b"} {
		u, _ := quota.NewUsage()
		for range 100 * (1 + 2*i) { // task-b serves three times as much of ads
			u.Add("ads", criticality.Critical, time.Millisecond)
		}
		l := quota.NewLeased(nil, nil)
		c, err := quotaservice.NewClient(cc, name, u, l)
		if err != nil {
			t.Fatal(err)
		}
		tasks = append(tasks, task{u, l, c})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for round := range 2 { // the second round sees both tasks' demand
		for _, tk := range tasks {
			if err := tk.c.RefreshOnce(ctx); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
	}
	a, _ := tasks[0].l.Limit("ads", criticality.Critical)
	b, _ := tasks[1].l.Limit("ads", criticality.Critical)
	t.Logf("ads limit on task-a %.3f, task-b %.3f", a, b)
	if math.Abs(a+b-4) > 1e-6 || b < 2.5*a {
		t.Errorf("limits %.3f + %.3f: want 4 split about 1:3", a, b)
	}
	if ok, failed := tasks[0].c.Refreshes(); ok != 2 || failed != 0 {
		t.Errorf("refreshes %d ok, %d failed", ok, failed)
	}
	_, err := quotapb.NewQuotaClient(cc).Refresh(ctx, &quotapb.RefreshRequest{Task: "t", Customers: []*quotapb.CustomerUsage{{Customer: "ads", Demand: math.NaN()}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("NaN demand: %v", err)
	}
	if _, err := quotaservice.NewClient(cc, "bad task", tasks[0].u, tasks[0].l); err == nil {
		t.Error("bad task id accepted")
	}
}

// FuzzQuotaRefresh feeds arbitrary bytes to the quota service as a
// RefreshRequest: it answers a lease or INVALID_ARGUMENT, never panics,
// and a lease it answers is well formed.
func FuzzRefresh(f *testing.F) {
	for _, r := range []*quotapb.RefreshRequest{
		{Task: "t1", Customers: []*quotapb.CustomerUsage{{Customer: "ads", Used: []float64{0, 0, 1, 0}, Demand: 2}}},
		{Task: "t2", Customers: []*quotapb.CustomerUsage{{Customer: "(other)", Used: []float64{1}, Demand: 1}, {Customer: "b", Demand: 0}}},
		{Task: "", Customers: []*quotapb.CustomerUsage{{Customer: "a", Used: []float64{1, 2, 3, 4, 5}}}},
		{Task: "t3", Customers: []*quotapb.CustomerUsage{{Customer: "a"}, {Customer: "a"}}},
	} {
		f.Add(r.Marshal())
	}
	f.Add([]byte{})
	f.Add([]byte("\x0a\x02t1\x12\x0b\x0a\x01a\x11\x00\x00\x00\x00\x00\x00\xf8\x7f"))
	p, _ := quota.New(quota.Config{Customers: map[string]quota.Limit{"ads": {CPU: 4, ByCriticality: map[string]float64{"SHEDDABLE": 1}}}})
	a, _ := quota.NewAllocator(p, quota.WithMaxTasks(1000))
	svc := quotaservice.NewService(a)
	f.Fuzz(func(t *testing.T, b []byte) {
		var req quotapb.RefreshRequest
		if req.Unmarshal(b) != nil {
			return
		}
		resp, err := svc.Refresh(context.Background(), &req)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument && c != codes.ResourceExhausted {
				t.Fatalf("error %v", err)
			}
			return
		}
		if resp.GetLeaseMs() <= 0 || resp.GetTasks() < 1 || len(resp.GetGrants()) > len(req.GetCustomers())+1 {
			t.Fatalf("lease %v", resp)
		}
		for _, g := range append(resp.GetGrants(), resp.GetDefault()) {
			if s := g.GetShare(); !(s >= 0 && s <= 1) || len(g.GetByCriticality()) != 4 {
				t.Fatalf("grant %v", g)
			}
		}
	})
}

// A request that names no customer (every untrusted caller's) is accounted
// under quota.Other, and the task's report still renews its lease (issue
// 21, item 1: it used to be charged to "", which made the quota service
// refuse every report from the task).
func TestRequestsWithoutACustomerKeepTheLease(t *testing.T) {
	addr, _ := quotaServer(t, quota.Config{Customers: map[string]quota.Limit{"ads": {CPU: 4}}, Tasks: 1})
	cc := loopback.DialGRPC(t, addr, quotaservice.DialOptions(time.Second)...)
	u, _ := quota.NewUsage()
	u.Add("ads", criticality.Critical, time.Millisecond)
	u.Add(quota.CustomerOf(context.Background()), criticality.Critical, time.Millisecond) // a request without a customer
	u.Refused("")
	l := quota.NewLeased(nil, nil)
	c, err := quotaservice.NewClient(cc, "task-a", u, l)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.RefreshOnce(ctx); err != nil {
		t.Fatalf("a report with a request that named no customer: %v", err)
	}
	for _, cu := range u.Snapshot() {
		if cu.Customer == "" {
			t.Fatalf("usage reported under the empty name: %+v", cu)
		}
	}
	if u.Total(quota.Other) <= 0 {
		t.Errorf("the request without a customer was not accounted under %s", quota.Other)
	}
}
