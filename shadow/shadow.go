// Package shadow is shadow mode: triage's refusing mechanisms decide as
// they would, report what they would have refused, and refuse nothing, so
// that an operator can see what triage would do to their traffic before it
// does anything.
//
// A Set names the mechanisms in shadow; the zero Set shadows none and All
// shadows every one. A server takes one Set for its intake
// (intake.WithShadow, given to triagegrpc.WithIntake or triagehttp.WithIntake), a
// client one for its retry.Policy (retry.WithShadow). Each would-be
// refusal goes to an Observer, by mechanism, reason and criticality:
// triageprom's metrics, Log's sampled log line, or Counts.
//
// What a mechanism in shadow does instead of refusing: the request goes on
// as if the mechanism had not seen it (no execution slot, no quota
// reservation, no charge), so that the mechanism's own state evolves as it
// would under enforcement; what differs is the load the task carries,
// which enforcement would have shed. So under overload, shadow's
// would-refuse counts are close to enforcement's refusals for the
// decisions made on arrival (quotas, signals, the pending count, black
// holes) and run higher for those made on the measured delay, which the
// unshed load raises (docs/shadow.md).
package shadow

import (
	"sync"

	"github.com/triagehq/triage/criticality"
)

// Mechanism is one of triage's refusing mechanisms.
type Mechanism uint8

const (
	// Admission: backend admission control (admission.Controller), every
	// reason but the connection penalty's.
	Admission Mechanism = iota
	// Quota: per-customer quotas (quota.Enforcer).
	Quota
	// Isolation: a client type sent to the black hole (isolate).
	Isolation
	// Connection: a slow sender's connection penalty (intake.Conn).
	Connection
	// Throttle: the client's adaptive throttle (throttle, in retry.Policy).
	Throttle
	// RetryBudget: the client's per-client retry budget (retry.Budget).
	RetryBudget
	// NumMechanisms is the number of mechanisms.
	NumMechanisms
)

var mechanismNames = [NumMechanisms]string{"admission", "quota", "isolation", "connection", "throttle", "retry-budget"}

// String returns the mechanism's metric name.
func (m Mechanism) String() string {
	if m < NumMechanisms {
		return mechanismNames[m]
	}
	return "unknown"
}

// Reasons lists, per mechanism, every reason its would-be refusals give,
// so that metrics can fix their series in advance.
var Reasons = [NumMechanisms][]string{
	Admission:   {"concurrency", "utilization", "deadline", "late", "forced", "queue"},
	Quota:       {"out-of-quota"},
	Isolation:   {"black-hole"},
	Connection:  {"slow-sender"},
	Throttle:    {"throttled"},
	RetryBudget: {"retry-budget"},
}

// Set is a set of mechanisms in shadow. The zero Set has none.
type Set uint8

// Of returns the Set of ms.
func Of(ms ...Mechanism) Set {
	var s Set
	for _, m := range ms {
		if m < NumMechanisms {
			s |= 1 << m
		}
	}
	return s
}

// All returns the Set of every mechanism.
func All() Set { return 1<<NumMechanisms - 1 }

// Has reports whether m is in shadow.
func (s Set) Has(m Mechanism) bool { return s&(1<<m) != 0 }

// Observer is told each refusal a mechanism in shadow would have made.
// Implementations must be cheap and safe for concurrent use.
type Observer interface {
	WouldRefuse(m Mechanism, reason string, l criticality.Level)
}

// Nop is an Observer that does nothing.
type Nop struct{}

// WouldRefuse does nothing.
func (Nop) WouldRefuse(Mechanism, string, criticality.Level) {}

// Tee returns an Observer that tells each of obs, nil ones skipped.
func Tee(obs ...Observer) Observer {
	var out tee
	for _, o := range obs {
		if o != nil {
			out = append(out, o)
		}
	}
	return out
}

type tee []Observer

func (t tee) WouldRefuse(m Mechanism, reason string, l criticality.Level) {
	for _, o := range t {
		o.WouldRefuse(m, reason, l)
	}
}

// Key names one count of Counts.
type Key struct {
	Mechanism Mechanism
	Reason    string
	Level     criticality.Level
}

// Counts is an Observer that counts would-be refusals by mechanism,
// reason and criticality. The zero value is ready to use; it is safe for
// concurrent use. It holds at most one count per Key the mechanisms can
// give (Reasons: 11 reasons x 4 criticalities); keys outside Reasons are
// not counted.
type Counts struct {
	mu sync.Mutex
	n  map[Key]int64
}

// WouldRefuse counts one would-be refusal.
func (c *Counts) WouldRefuse(m Mechanism, reason string, l criticality.Level) {
	if m >= NumMechanisms || !l.Valid() || reasonIndex(m, reason) < 0 {
		return
	}
	c.mu.Lock()
	if c.n == nil {
		c.n = make(map[Key]int64)
	}
	c.n[Key{m, reason, l}]++
	c.mu.Unlock()
}

// Snapshot returns a copy of the counts.
func (c *Counts) Snapshot() map[Key]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[Key]int64, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}
