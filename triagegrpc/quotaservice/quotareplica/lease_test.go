package quotareplica

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/triagehq/triage/quota/allocate"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/triagegrpc/quotaservice"
)

// steppedClock is a machine's clock whose wall time an operator (or NTP)
// steps back, while its monotonic time goes on: Now is the wall time,
// Since the monotonic time since a reading taken before any step.
type steppedClock struct {
	*clock.Fake
	back atomic.Int64 // ns the wall clock was stepped back
}

func (c *steppedClock) Now() time.Time { return c.Fake.Now().Add(-time.Duration(c.back.Load())) }

func (c *steppedClock) Since(t time.Time) time.Duration { return c.Fake.Now().Sub(t) }

// Issue 38: a leader cut off from etcd stops granting once half its TTL
// has passed since its last renewal, however its wall clock moves: a step
// back of more than TTL/2 does not make the lease look fresh.
func TestLeaderStopsGrantingWhenTheWallClockStepsBack(t *testing.T) {
	clk := &steppedClock{Fake: clock.NewFake(time.Unix(1_800_000_000, 0))}
	p, err := quota.New(quota.Config{})
	if err != nil {
		t.Fatal(err)
	}
	alloc, err := allocate.New(p)
	if err != nil {
		t.Fatal(err)
	}
	r := &Replica{ttl: 10, clk: clk, since: clock.SinceFunc(clk, clk.Now()), leading: quotaservice.NewService(alloc)}
	clk.Advance(time.Minute)
	r.lastRenew.Store(int64(r.since())) // the last renewal etcd acknowledged
	if r.granting() == nil {
		t.Fatal("a leader just renewed does not grant")
	}
	clk.back.Store(int64(30 * time.Second)) // NTP steps the wall clock back
	clk.Advance(6 * time.Second)            // past TTL/2 with no renewal
	if r.granting() != nil {
		t.Fatal("a leader 6 s past its last renewal (TTL 10 s) grants after its wall clock stepped back 30 s: etcd may have let its lease expire")
	}
}
