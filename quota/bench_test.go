package quota

import (
	"testing"
	"time"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/quota/usage"
)

// BenchmarkEnforcerAdmit: a soft-limited customer on an overloaded task,
// admitted or refused (the refusal allocates nothing).
func BenchmarkEnforcerAdmit(b *testing.B) {
	p, _ := New(Config{Customers: map[string]Limit{"ads": {CPU: 0.001}}})
	u, _ := usage.New()
	e, _ := NewEnforcer(p, u, WithOverload(func() bool { return true }))
	u.Add("ads", criticality.Sheddable, time.Second)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			e.Reserve("ads", criticality.Sheddable)
		}
	})
}
