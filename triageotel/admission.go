package triageotel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/criticality"
)

// admissionInstruments are admission control's instruments.
type admissionInstruments struct {
	admitted, rejected, degraded metric.Int64Counter
	limit                        metric.Int64Gauge
	wait                         metric.Float64Histogram
	// read at collection (AdmissionState)
	pending, pendingCap, executing, queued, away, stalled metric.Int64ObservableGauge
	service, retryShare, signal, forced                   metric.Float64ObservableGauge
	attempts                                              metric.Int64ObservableCounter
}

func newAdmissionInstruments(m metric.Meter, counter func(name, unit, desc string) metric.Int64Counter, errs *[]error) admissionInstruments {
	var a admissionInstruments
	add := func(err error) { *errs = append(*errs, err) }
	a.admitted = counter("triage.admission.admitted", "{request}", "Requests given an execution slot by admission control, by criticality.")
	a.rejected = counter("triage.admission.rejected", "{request}", "Requests rejected by admission control, by criticality, reason (concurrency, utilization, deadline) and answer (task-overloaded, overloaded-dont-retry).")
	a.degraded = counter("triage.admission.degraded", "{request}", "Requests told by admission control to serve a degraded answer, by criticality.")
	var err error
	a.limit, err = m.Int64Gauge("triage.admission.limit", metric.WithUnit("{request}"), metric.WithDescription("Execution limit found by admission control."))
	add(err)
	a.wait, err = m.Float64Histogram("triage.admission.wait", metric.WithUnit("s"),
		metric.WithDescription("Time a request waited in admission control's queue for its execution slot (0 for one that got it at once), by criticality."),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
	add(err)
	gauge := func(name, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithUnit("{request}"), metric.WithDescription(desc))
		add(err)
		return g
	}
	fgauge := func(name, unit, desc string) metric.Float64ObservableGauge {
		g, err := m.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		add(err)
		return g
	}
	a.pending = gauge("triage.admission.pending", "Requests admitted and not done (not yet started, waiting, running).")
	a.pendingCap = gauge("triage.admission.pending_cap", "Current bound on admitted requests (before criticality headroom), found by the controller.")
	a.executing = gauge("triage.admission.executing", "Requests holding an execution slot.")
	a.queued = gauge("triage.admission.queued", "Requests waiting for an execution slot.")
	a.away = gauge("triage.admission.away", "Running requests waiting on a downstream call, without an execution slot (in pending).")
	a.stalled = gauge("triage.admission.stalled", "Running requests waiting on their own client, without an execution slot (not in pending).")
	a.service = fgauge("triage.admission.service", "s", "Mean service time of the last interval.")
	a.retryShare = fgauge("triage.admission.retry_ratio", "1", "Share of retries among recent requests (the attempt histogram).")
	a.signal = fgauge("triage.admission.signal_ratio", "1", "Utilization signal value as a fraction of its target, by signal.")
	a.forced = fgauge("triage.admission.forced_shed_ratio", "1", "Fraction of the criticality's requests a ForceShed drill rejects now (0: no drill).")
	a.attempts, err = m.Int64ObservableCounter("triage.admission.attempts", metric.WithUnit("{request}"),
		metric.WithDescription("Requests that arrived, by criticality and attempt counter (0: first attempt; 2: second retry or later): the attempt histogram the don't-retry rule reads (SRE book Figure 21-1)."))
	add(err)
	return a
}

// AdmissionObserver is an admission.Observer for one Controller, returned
// by Metrics.Admission. Its attribute sets are resolved once.
type AdmissionObserver struct {
	in       *admissionInstruments
	admitted [criticality.NumLevels]metric.AddOption
	degraded [criticality.NumLevels]metric.AddOption
	wait     [criticality.NumLevels]metric.RecordOption
	rejected [criticality.NumLevels][admission.NumReasons][2]metric.AddOption
}

// Admission returns the observer to pass to admission.WithObserver:
// triage.admission.admitted{criticality},
// triage.admission.rejected{criticality, reason, answer},
// triage.admission.degraded{criticality}, the histogram
// triage.admission.wait{criticality} and the gauge
// triage.admission.limit. Register the controller's state with
// AdmissionState once it exists.
func (m *Metrics) Admission() *AdmissionObserver {
	o := &AdmissionObserver{in: &m.adm}
	for _, l := range criticality.All() {
		c := keyCriticality.String(l.String())
		o.admitted[l] = addSet(c)
		o.degraded[l] = addSet(c)
		o.wait[l] = metric.WithAttributeSet(attribute.NewSet(c))
		for r := admission.Reason(0); r < admission.NumReasons; r++ {
			o.rejected[l][r][0] = addSet(c, keyReason.String(r.String()), keyAnswer.String("task-overloaded"))
			o.rejected[l][r][1] = addSet(c, keyReason.String(r.String()), keyAnswer.String("overloaded-dont-retry"))
			o.in.rejected.Add(bg, 0, o.rejected[l][r][0])
			o.in.rejected.Add(bg, 0, o.rejected[l][r][1])
		}
		o.in.admitted.Add(bg, 0, o.admitted[l])
		o.in.degraded.Add(bg, 0, o.degraded[l])
	}
	return o
}

// Observe implements admission.Observer.
func (o *AdmissionObserver) Observe(e admission.Event) {
	l := lvl(e.Level)
	switch e.Kind {
	case admission.Admitted:
		o.in.admitted.Add(bg, 1, o.admitted[l])
		o.in.wait.Record(bg, e.Wait.Seconds(), o.wait[l])
	case admission.Rejected:
		if e.Reason < admission.NumReasons {
			i := 0
			if e.DontRetry {
				i = 1
			}
			o.in.rejected.Add(bg, 1, o.rejected[l][e.Reason][i])
		}
	case admission.Degraded:
		o.in.degraded.Add(bg, 1, o.degraded[l])
	case admission.LimitChanged:
		o.in.limit.Record(bg, int64(e.Limit))
	}
}

var _ admission.Observer = (*AdmissionObserver)(nil)

// AdmissionState registers a callback that reads ctl's Stats at each
// collection: triage.admission.pending, .pending_cap, .executing, .queued,
// .away, .stalled, .service, .retry_ratio,
// triage.admission.signal_ratio{signal},
// triage.admission.forced_shed_ratio{criticality} and the attempt
// histogram triage.admission.attempts{criticality, attempt}.
// With several controllers (one per upstream cluster), give each its
// attributes kv, added to every one of its data points. Unregister it
// when the controller goes away.
func (m *Metrics) AdmissionState(ctl *admission.Controller, kv ...attribute.KeyValue) (metric.Registration, error) {
	a := &m.adm
	with := func(more ...attribute.KeyValue) metric.ObserveOption {
		return metric.WithAttributes(append(more, kv...)...)
	}
	return m.meter.RegisterCallback(func(_ context.Context, ob metric.Observer) error {
		st := ctl.Stats()
		ob.ObserveInt64(a.pending, int64(st.Pending), with())
		ob.ObserveInt64(a.pendingCap, int64(st.PendingCap), with())
		ob.ObserveInt64(a.executing, int64(st.Executing), with())
		ob.ObserveInt64(a.queued, int64(st.Queued), with())
		ob.ObserveInt64(a.away, int64(st.Away), with())
		ob.ObserveInt64(a.stalled, int64(st.Stalled), with())
		ob.ObserveFloat64(a.service, st.ServiceTime.Seconds(), with())
		ob.ObserveFloat64(a.retryShare, st.RetryShare, with())
		for name, u := range st.Signals {
			ob.ObserveFloat64(a.signal, u, with(keySignal.String(name)))
		}
		for l, f := range st.Forced {
			ob.ObserveFloat64(a.forced, f, with(keyCriticality.String(criticality.Level(l).String())))
		}
		for l, row := range st.Attempts {
			for n, v := range row {
				ob.ObserveInt64(a.attempts, int64(v), with(keyCriticality.String(criticality.Level(l).String()), keyAttempt.String(itoa(n))))
			}
		}
		return nil
	}, a.pending, a.pendingCap, a.executing, a.queued, a.away, a.stalled, a.service, a.retryShare, a.signal, a.forced, a.attempts)
}
