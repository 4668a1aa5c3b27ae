package quotaservice_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/triagehq/triage/quota/allocate"
	"github.com/triagehq/triage/quota/usage"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagegrpc/quotaservice"
	"github.com/triagehq/triage/triagegrpc/quotaservice/quotapb"
)

// A quota service and one task leasing from it over loopback (what
// `triage quota-server` serves); in a task, run Client.Run in a
// goroutine instead of one RefreshOnce, and give the Leased to
// quota.NewEnforcer.
func ExampleClient() {
	policy, _ := quota.New(quota.Config{Customers: map[string]quota.Limit{"ads": {CPU: 4}}, Tasks: 2})
	alloc, _ := allocate.New(policy)
	gs := grpc.NewServer()
	quotapb.RegisterQuotaServer(gs, quotaservice.NewService(alloc))
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	go gs.Serve(lis)
	defer gs.Stop()

	cc, _ := grpc.NewClient(lis.Addr().String(), append(quotaservice.DialOptions(5*time.Second),
		grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	defer cc.Close()
	table, _ := usage.New()
	leased := quota.NewLeased(nil, nil)
	qc, _ := quotaservice.NewClient(cc, "task-1", table, leased)
	if err := qc.RefreshOnce(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	// The service has just started (learning mode): the safe share, 4/2.
	limit, _ := leased.Limit("ads", criticality.Critical)
	fmt.Printf("ads: %.1f CPU-seconds per second on this task\n", limit)
	// Output: ads: 2.0 CPU-seconds per second on this task
}
