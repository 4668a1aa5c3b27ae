package signals

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/triagehq/triage/clock"
)

// A reported reading holds until it is older than the max age, a later
// one replaces it, and readings that are not a utilization are ignored.
func TestReportedReadingsAgeOut(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	r, err := NewReported("upstream", time.Second, f)
	if err != nil {
		t.Fatal(err)
	}
	if u := r.Utilization(); u != 0 {
		t.Fatalf("no reading yet: %v, want 0", u)
	}
	r.Set(0.9)
	if u := r.Utilization(); u != 0.9 {
		t.Fatalf("a reading set now: %v, want 0.9", u)
	}
	f.Advance(time.Second)
	if u := r.Utilization(); u != 0.9 {
		t.Fatalf("a reading as old as the max age: %v, want 0.9", u)
	}
	for _, bad := range []float64{math.NaN(), -0.5, math.Inf(1)} {
		r.Set(bad)
	}
	f.Advance(time.Millisecond)
	if u := r.Utilization(); u != 0 {
		t.Fatalf("a reading past the max age (and only bad ones since): %v, want 0", u)
	}
	r.Set(1.4)
	if u := r.Utilization(); u != 1.4 {
		t.Fatalf("a new reading: %v, want 1.4", u)
	}
	if _, err := NewReported("", time.Second, f); !errors.Is(err, ErrConfig) {
		t.Errorf("no name: %v", err)
	}
	if _, err := NewReported("x", 0, f); !errors.Is(err, ErrConfig) {
		t.Errorf("no max age: %v", err)
	}
}
