package grantlog

import (
	"bytes"
	"math"
	"testing"
	"time"

	"github.com/triagehq/triage/quota"
)

func TestMaxHeld(t *testing.T) {
	t0 := time.Unix(100, 0)
	var buf bytes.Buffer
	now := t0
	w := NewWriter(&buf, "r1", func() time.Time { return now })
	lease := func(share float64) quota.Lease {
		return quota.Lease{Grants: []quota.Grant{{Customer: "a", Share: share}}, Duration: 5 * time.Second}
	}
	w.Lease("x", lease(0.6))
	w.Lease("y", lease(0.4))
	now = t0.Add(time.Second)
	w.Lease("x", lease(0.3)) // x gives back before y is raised
	now = t0.Add(2 * time.Second)
	w.Lease("y", lease(0.7))
	now = t0.Add(8 * time.Second) // x's last lease ran out at 6 s
	w.Lease("z", lease(0.3))
	recs, err := Read(&buf, 100)
	if err != nil || len(recs) != 5 {
		t.Fatalf("read %d records: %v", len(recs), err)
	}
	got := MaxHeld(recs, 100*time.Millisecond)["a"]
	if math.Abs(got.Sum-1) > 1e-9 {
		t.Errorf("peak %.3f at %v, want 1.0", got.Sum, got.At.Sub(t0))
	}
	// y raised before x gave back: 1.3 at once.
	recs[2].At, recs[3].At = recs[3].At, recs[2].At
	if got := MaxHeld(recs, 0)["a"]; math.Abs(got.Sum-1.3) > 1e-9 {
		t.Errorf("peak %.3f, want 1.3", got.Sum)
	}
	if _, err := Read(bytes.NewBufferString("{}\nnot json\n"), 10); err == nil {
		t.Error("a line that is not JSON was read")
	}
}
