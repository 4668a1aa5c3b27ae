package usage

import (
	"fmt"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/criticality"
)

// Tables at their bound (issue 21, item 7): with every tracked customer
// active, a flood of new names is counted under Other at O(1) per
// request: the map is swept for idle customers at most once a bucket, not
// once per request under the write lock; and an idle customer still makes
// room at the next sweep.
func TestUsageFloodOfNewCustomersIsO1(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	u, err := New(WithMaxTracked(1000), WithClock(f))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		u.Add(fmt.Sprintf("c%d", i), criticality.Critical, time.Millisecond)
	}
	before := u.scanned
	for i := range 10000 {
		u.Add(fmt.Sprintf("flood-%d", i), criticality.Sheddable, time.Millisecond)
	}
	if n := u.scanned - before; n > 2*1000 {
		t.Errorf("10,000 requests of new customers visited %d tracked entries", n)
	}
	if got := len(u.byName); got != 1001 {
		t.Errorf("%d entries, want the 1000 tracked and Other", got)
	}
	if u.Snapshot()[0].Customer == "" {
		t.Error("blank name in the snapshot")
	}
	f.Advance(5 * time.Second) // every tracked customer idle for a window
	u.Add("newcomer", criticality.Critical, time.Millisecond)
	if u.lookup("newcomer") == nil {
		t.Error("an idle window later, a new customer is still not tracked")
	}
}
