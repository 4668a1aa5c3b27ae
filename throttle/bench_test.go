package throttle_test

import (
	"testing"
	"time"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/throttle"
)

// BenchmarkDecision is one request's throttling decision plus its
// bookkeeping (AllowAt, then AcceptedAt), at a given time; run with
// -cpu 1,2. /realclock reads the real clock once per request.
func BenchmarkDecision(b *testing.B) {
	th, err := throttle.New()
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	b.Run("fixedtime", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if th.AllowAt(criticality.Critical, now) {
					th.AcceptedAt(criticality.Critical, now)
				}
			}
		})
	})
	b.Run("realclock", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				t := time.Now()
				if th.AllowAt(criticality.Critical, t) {
					th.AcceptedAt(criticality.Critical, t)
				}
			}
		})
	})
}
