package throttle_test

import (
	"testing"
	"time"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/throttle"
)

// BenchmarkDecision is one request's throttling decision plus its
// bookkeeping (Allow, then Done with the answer); run with -cpu 1,2.
// /realclock reads the real clock as the adapters do (monotonic only);
// /fixedtime passes a time, as the simulator does.
func BenchmarkDecision(b *testing.B) {
	b.Run("realclock", func(b *testing.B) {
		th, err := throttle.New()
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if tk, ok := th.Allow(criticality.Critical); ok {
					tk.Done(true)
				}
			}
		})
	})
	b.Run("fixedtime", func(b *testing.B) {
		th, err := throttle.New()
		if err != nil {
			b.Fatal(err)
		}
		now := time.Now()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if tk, ok := th.AllowAt(criticality.Critical, now); ok {
					tk.Done(true)
				}
			}
		})
	})
}
