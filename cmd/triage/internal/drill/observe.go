package drill

import (
	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/shadow"
)

// observer counts the task's admission and client-side refusals among
// its rejections, by reason and criticality.
type observer struct{ t *task }

func (o observer) Observe(e admission.Event) {
	if e.Kind == admission.Rejected {
		o.t.reject("admission " + e.Reason.String() + " " + e.Level.String())
	}
}
func (o observer) Requested(criticality.Level)       {}
func (o observer) Answered(criticality.Level, bool)  {}
func (o observer) Throttled(l criticality.Level)     { o.t.reject("throttled " + l.String()) }
func (o observer) Retried(criticality.Level)         {}
func (o observer) BudgetRefused(l criticality.Level) { o.t.reject("retry budget " + l.String()) }
func (o observer) Exhausted(criticality.Level)       {}

// shadowObserver counts the task's would-be refusals in shadow among its
// rejections, marked "would": "would admission concurrency SHEDDABLE",
// "would throttle throttled CRITICAL", ...
type shadowObserver struct{ t *task }

func (o shadowObserver) WouldRefuse(m shadow.Mechanism, reason string, l criticality.Level) {
	o.t.reject("would " + m.String() + " " + reason + " " + l.String())
}

// shadowing returns the task's shadow options' arguments: every
// mechanism, when the task runs in shadow, else none.
func (t *task) shadowing() (shadow.Set, shadow.Observer) {
	if !t.cfg.Shadow {
		return 0, nil
	}
	return shadow.All(), shadowObserver{t}
}
