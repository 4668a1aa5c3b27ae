package drill

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/retry"
)

// Spent is where one task's requests of one criticality spent their time,
// summed since the task started, in ms: the wait in admission control's
// queue for an execution slot (Queue), the wait for a slot of the
// emulated machine and the host's lateness in ending its work (Slot: no
// wait with triage, whose execution slots are the machine's), the
// machine's work (Service), the call to the next tier
// (Downstream, its retries and their backoffs included) and the backoffs
// before this task's retries to the next tier (Backoff). N counts the
// requests that reached the task's handler; Queue is summed over the same
// requests, as the intake admits them.
type Spent struct {
	N          int64   `json:"n"`
	Queue      float64 `json:"queue_ms"`
	Slot       float64 `json:"slot_ms"`
	Service    float64 `json:"service_ms"`
	Downstream float64 `json:"downstream_ms"`
	Backoff    float64 `json:"backoff_ms"`
}

// spentPart names a field of Spent.
type spentPart int

const (
	partQueue spentPart = iota
	partSlot
	partService
	partDownstream
	partBackoff
	numParts
)

// Unlabelled is the criticality under which a task without triage past
// the frontend counts its requests' time: nothing tells it their
// criticality.
const Unlabelled = "UNLABELLED"

// unlabelled is Unlabelled's index in a spending.
const unlabelled = criticality.Level(criticality.NumLevels)

// spending sums a task's Spent by criticality (and unlabelled) with
// atomics: it is told from the requests' goroutines, and read by /stats.
type spending struct {
	n  [criticality.NumLevels + 1]atomic.Int64
	ns [criticality.NumLevels + 1][numParts]atomic.Int64
}

// add counts d in part p for level l (or unlabelled).
func (s *spending) add(l criticality.Level, p spentPart, d time.Duration) {
	if l <= unlabelled && d > 0 {
		s.ns[l][p].Add(int64(d))
	}
}

// handled counts a request of level l (or unlabelled) that reached the
// handler.
func (s *spending) handled(l criticality.Level) {
	if l <= unlabelled {
		s.n[l].Add(1)
	}
}

// snapshot returns the sums so far, by criticality name.
func (s *spending) snapshot() map[string]Spent {
	out := map[string]Spent{}
	for l := range s.n {
		n := s.n[l].Load()
		if n == 0 {
			continue
		}
		ms := func(p spentPart) float64 { return float64(s.ns[l][p].Load()) / float64(time.Millisecond) }
		name := Unlabelled
		if lv := criticality.Level(l); lv.Valid() {
			name = lv.String()
		}
		out[name] = Spent{N: n, Queue: ms(partQueue), Slot: ms(partSlot), Service: ms(partService),
			Downstream: ms(partDownstream), Backoff: ms(partBackoff)}
	}
	return out
}

// intakeSpent tells a task's spending of the intake's admission waits.
type intakeSpent struct{ s *spending }

func (t intakeSpent) Trace(_ context.Context, e *intake.Event) {
	if e.Kind == intake.Admitted {
		t.s.add(e.Level, partQueue, e.Wait)
	}
}

// quotaTrace is a gRPC task's intake tracer: its spending, as
// intakeSpent's, and the customers its quota refused, among the task's
// refusals (the admission Observer tells the others).
type quotaTrace struct{ t *task }

func (q quotaTrace) Trace(ctx context.Context, e *intake.Event) {
	intakeSpent{&q.t.spent}.Trace(ctx, e)
	if oe, ok := outcome.As(e.Err); ok && e.Kind == intake.Refused && oe.Kind == outcome.OutOfQuota {
		q.t.reject("out-of-quota " + e.Level.String() + " " + e.Customer + " on " + q.t.cfg.ID)
	}
}

// retrySpent tells a task's spending of its client's backoffs.
type retrySpent struct{ s *spending }

func (t retrySpent) Trace(_ context.Context, e *retry.Event) {
	if e.Kind == retry.Retried {
		t.s.add(e.Level, partBackoff, e.Backoff)
	}
}

// Breakdown is the mean time a tier's requests of one criticality spent
// in each part of Spent, in ms per request, over the N requests that
// reached its handlers.
type Breakdown Spent

// plus adds b's sums to s.
func (s Spent) plus(b Spent) Spent {
	return Spent{N: s.N + b.N, Queue: s.Queue + b.Queue, Slot: s.Slot + b.Slot, Service: s.Service + b.Service,
		Downstream: s.Downstream + b.Downstream, Backoff: s.Backoff + b.Backoff}
}

// since is s less an earlier reading of the same task's sums, or s when
// the task restarted in between (its sums began again from zero).
func (s Spent) since(last Spent) Spent {
	if s.N < last.N {
		return s
	}
	return Spent{N: s.N - last.N, Queue: s.Queue - last.Queue, Slot: s.Slot - last.Slot, Service: s.Service - last.Service,
		Downstream: s.Downstream - last.Downstream, Backoff: s.Backoff - last.Backoff}
}

// mean is s as means per request.
func (s Spent) mean() Breakdown {
	if s.N == 0 {
		return Breakdown{}
	}
	n := float64(s.N)
	return Breakdown{N: s.N, Queue: s.Queue / n, Slot: s.Slot / n, Service: s.Service / n, Downstream: s.Downstream / n, Backoff: s.Backoff / n}
}

// tierSpent sums Spent by tier and criticality: tierSpent[role][level].
type tierSpent map[string]map[string]Spent

func (ts tierSpent) add(role, level string, s Spent) {
	if ts[role] == nil {
		ts[role] = map[string]Spent{}
	}
	ts[role][level] = ts[role][level].plus(s)
}

// means is ts as Breakdowns.
func (ts tierSpent) means() map[string]map[string]Breakdown {
	if len(ts) == 0 {
		return nil
	}
	out := map[string]map[string]Breakdown{}
	for role, by := range ts {
		out[role] = map[string]Breakdown{}
		for l, s := range by {
			out[role][l] = s.mean()
		}
	}
	return out
}
