package triageprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/retry"
)

// clientVecs are the client-side series (retry.Observer), labelled by the
// backend service a client calls and by criticality.
type clientVecs struct {
	requests, accepts, rejects, throttled, retries, refusals, exhausted *prometheus.CounterVec
}

func newClientVecs() clientVecs {
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"target", "criticality"})
	}
	return clientVecs{
		requests:  vec("triage_client_requests_total", "Requests the application made through a triage client, before retries and throttling."),
		accepts:   vec("triage_client_accepts_total", "Attempts the backend accepted (any answer that is not an overload or quota rejection)."),
		rejects:   vec("triage_client_backend_rejections_total", "Attempts the backend rejected as overloaded or out of quota (or left unanswered past the deadline)."),
		throttled: vec("triage_client_throttled_total", "Attempts rejected locally by client-side adaptive throttling, never sent."),
		retries:   vec("triage_client_retries_total", "Retries sent (second and third attempts)."),
		refusals:  vec("triage_client_retry_budget_refusals_total", "Retries the per-client retry budget refused."),
		exhausted: vec("triage_client_attempts_exhausted_total", "Requests whose every attempt was rejected as overloaded."),
	}
}

func (v clientVecs) each(f func(*prometheus.CounterVec)) {
	for _, c := range []*prometheus.CounterVec{v.requests, v.accepts, v.rejects, v.throttled, v.retries, v.refusals, v.exhausted} {
		f(c)
	}
}

// ClientObserver is a retry.Observer for one backend service, returned by
// Metrics.Client. Its counters are resolved once, so observing does not
// allocate.
type ClientObserver struct {
	requests, accepts, rejects, throttled, retries, refusals, exhausted [criticality.NumLevels]prometheus.Counter
}

// Client returns the observer for the client of one backend service (a
// short, fixed name such as "backend-b"; every name adds 28 series). Pass it
// to retry.WithObserver.
func (m *Metrics) Client(target string) *ClientObserver {
	o := &ClientObserver{}
	for _, l := range criticality.All() {
		lv := []string{target, l.String()}
		o.requests[l] = m.client.requests.WithLabelValues(lv...)
		o.accepts[l] = m.client.accepts.WithLabelValues(lv...)
		o.rejects[l] = m.client.rejects.WithLabelValues(lv...)
		o.throttled[l] = m.client.throttled.WithLabelValues(lv...)
		o.retries[l] = m.client.retries.WithLabelValues(lv...)
		o.refusals[l] = m.client.refusals.WithLabelValues(lv...)
		o.exhausted[l] = m.client.exhausted.WithLabelValues(lv...)
	}
	return o
}

func lvl(l criticality.Level) criticality.Level {
	if !l.Valid() {
		return criticality.Default
	}
	return l
}

// Requested implements retry.Observer.
func (o *ClientObserver) Requested(l criticality.Level) { o.requests[lvl(l)].Inc() }

// Answered implements retry.Observer.
func (o *ClientObserver) Answered(l criticality.Level, accepted bool) {
	if accepted {
		o.accepts[lvl(l)].Inc()
	} else {
		o.rejects[lvl(l)].Inc()
	}
}

// Throttled implements retry.Observer.
func (o *ClientObserver) Throttled(l criticality.Level) { o.throttled[lvl(l)].Inc() }

// Retried implements retry.Observer.
func (o *ClientObserver) Retried(l criticality.Level) { o.retries[lvl(l)].Inc() }

// BudgetRefused implements retry.Observer.
func (o *ClientObserver) BudgetRefused(l criticality.Level) { o.refusals[lvl(l)].Inc() }

// Exhausted implements retry.Observer.
func (o *ClientObserver) Exhausted(l criticality.Level) { o.exhausted[lvl(l)].Inc() }

var _ retry.Observer = (*ClientObserver)(nil)
