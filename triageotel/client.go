package triageotel

import (
	"go.opentelemetry.io/otel/metric"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/shadow"
)

// clientInstruments are the client-side instruments (retry.Observer),
// with attributes target and criticality.
type clientInstruments struct {
	requests, accepts, rejects, throttled, retries, refusals, exhausted metric.Int64Counter
}

func newClientInstruments(counter func(name, unit, desc string) metric.Int64Counter) clientInstruments {
	return clientInstruments{
		requests:  counter("triage.client.requests", "{request}", "Requests the application made through a triage client, before retries and throttling."),
		accepts:   counter("triage.client.accepts", "{attempt}", "Attempts the backend accepted (any answer that is not an overload or quota rejection)."),
		rejects:   counter("triage.client.backend_rejections", "{attempt}", "Attempts the backend rejected as overloaded or out of quota (or left unanswered past the deadline)."),
		throttled: counter("triage.client.throttled", "{attempt}", "Attempts rejected locally by client-side adaptive throttling, never sent."),
		retries:   counter("triage.client.retries", "{attempt}", "Retries sent (second and third attempts)."),
		refusals:  counter("triage.client.retry_budget_refusals", "{attempt}", "Retries the per-client retry budget refused."),
		exhausted: counter("triage.client.attempts_exhausted", "{request}", "Requests whose every attempt was rejected as overloaded."),
	}
}

// ClientObserver is a retry.Observer for one backend service, returned by
// Metrics.Client. Its attribute sets are resolved once, so observing does
// not allocate.
type ClientObserver struct {
	in  *clientInstruments
	set [criticality.NumLevels]metric.AddOption
}

// Client returns the observer for the client of one backend service (a
// short, fixed name such as "backend-b": every name adds 28 series). Pass
// it to retry.WithObserver.
func (m *Metrics) Client(target string) *ClientObserver {
	o := &ClientObserver{in: &m.client}
	for _, l := range criticality.All() {
		o.set[l] = addSet(keyTarget.String(target), keyCriticality.String(l.String()))
		for _, c := range []metric.Int64Counter{o.in.requests, o.in.accepts, o.in.rejects, o.in.throttled, o.in.retries, o.in.refusals, o.in.exhausted} {
			c.Add(bg, 0, o.set[l])
		}
	}
	return o
}

// Requested implements retry.Observer.
func (o *ClientObserver) Requested(l criticality.Level) { o.in.requests.Add(bg, 1, o.set[lvl(l)]) }

// Answered implements retry.Observer.
func (o *ClientObserver) Answered(l criticality.Level, accepted bool) {
	if accepted {
		o.in.accepts.Add(bg, 1, o.set[lvl(l)])
	} else {
		o.in.rejects.Add(bg, 1, o.set[lvl(l)])
	}
}

// Throttled implements retry.Observer.
func (o *ClientObserver) Throttled(l criticality.Level) { o.in.throttled.Add(bg, 1, o.set[lvl(l)]) }

// Retried implements retry.Observer.
func (o *ClientObserver) Retried(l criticality.Level) { o.in.retries.Add(bg, 1, o.set[lvl(l)]) }

// BudgetRefused implements retry.Observer.
func (o *ClientObserver) BudgetRefused(l criticality.Level) { o.in.refusals.Add(bg, 1, o.set[lvl(l)]) }

// Exhausted implements retry.Observer.
func (o *ClientObserver) Exhausted(l criticality.Level) { o.in.exhausted.Add(bg, 1, o.set[lvl(l)]) }

var _ retry.Observer = (*ClientObserver)(nil)

// shadowInstruments hold triage.shadow.would_refuse with an attribute set
// per mechanism, reason and criticality (shadow.Reasons).
type shadowInstruments struct {
	c   metric.Int64Counter
	set [shadow.NumMechanisms][][criticality.NumLevels]metric.AddOption
}

func newShadowInstruments(counter func(name, unit, desc string) metric.Int64Counter) shadowInstruments {
	s := shadowInstruments{c: counter("triage.shadow.would_refuse", "{request}",
		"Requests a mechanism in shadow mode would have refused and let through, by mechanism (admission, quota, isolation, connection, throttle, retry-budget), reason and criticality.")}
	for m := range shadow.NumMechanisms {
		s.set[m] = make([][criticality.NumLevels]metric.AddOption, len(shadow.Reasons[m]))
		for r, name := range shadow.Reasons[m] {
			for _, l := range criticality.All() {
				s.set[m][r][l] = addSet(keyMechanism.String(m.String()), keyReason.String(name), keyCriticality.String(l.String()))
			}
		}
	}
	return s
}

// zero reports every series at 0.
func (s *shadowInstruments) zero() {
	for _, rs := range s.set {
		for _, ls := range rs {
			for _, o := range ls {
				s.c.Add(bg, 0, o)
			}
		}
	}
}

// Shadow returns the observer to pass to the shadow options
// (intake.WithShadow, given to triagegrpc.WithIntake or triagehttp.WithIntake,
// retry.WithShadow): triage.shadow.would_refuse{mechanism, reason,
// criticality}.
func (m *Metrics) Shadow() shadow.Observer { return &m.shadow }

// WouldRefuse implements shadow.Observer.
func (s *shadowInstruments) WouldRefuse(m shadow.Mechanism, reason string, l criticality.Level) {
	if m >= shadow.NumMechanisms || !l.Valid() {
		return
	}
	for r, name := range shadow.Reasons[m] {
		if name == reason {
			s.c.Add(bg, 1, s.set[m][r][l])
			return
		}
	}
}
