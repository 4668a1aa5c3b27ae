package triageprom

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/criticality"
)

// AdmissionObserver is an admission.Observer for one Controller, returned
// by Metrics.Admission. Counters are resolved once.
type AdmissionObserver struct {
	admitted [criticality.NumLevels]prometheus.Counter
	degraded [criticality.NumLevels]prometheus.Counter
	wait     [criticality.NumLevels]lazyObserver // a level's series appears with its first wait
	rejected [criticality.NumLevels][admission.NumReasons][2]prometheus.Counter
	limit    prometheus.Gauge
}

// Admission returns the observer to pass to admission.WithObserver, and a
// collector of the controller's state (limits, occupancy, signal values)
// read at scrape time; register the collector with your registry once the
// Controller exists:
//
//	obs := m.Admission()
//	ctl, _ := admission.New(admission.WithObserver(obs))
//	reg.MustRegister(triageprom.AdmissionState(ctl))
//
// Series: triage_admission_admitted_total{criticality},
// triage_admission_rejected_total{criticality,reason,answer} (answer is
// task-overloaded or overloaded-dont-retry),
// triage_admission_degraded_total{criticality}, triage_admission_limit,
// triage_admission_wait_seconds{criticality} (a histogram).
func (m *Metrics) Admission() *AdmissionObserver {
	o := &AdmissionObserver{limit: m.admLimit}
	for _, l := range criticality.All() {
		o.admitted[l] = m.admAdmitted.WithLabelValues(l.String())
		o.degraded[l] = m.admDegraded.WithLabelValues(l.String())
		o.wait[l] = lazyObserver{vec: m.admWait, label: l.String()}
		for r := admission.Reason(0); r < admission.NumReasons; r++ {
			o.rejected[l][r][0] = m.admRejected.WithLabelValues(l.String(), r.String(), "task-overloaded")
			o.rejected[l][r][1] = m.admRejected.WithLabelValues(l.String(), r.String(), "overloaded-dont-retry")
		}
	}
	return o
}

// Observe implements admission.Observer.
func (o *AdmissionObserver) Observe(e admission.Event) {
	l := lvl(e.Level)
	switch e.Kind {
	case admission.Admitted:
		o.admitted[l].Inc()
		o.wait[l].get().Observe(e.Wait.Seconds())
	case admission.Rejected:
		if e.Reason < admission.NumReasons {
			o.rejected[l][e.Reason][b2i(e.DontRetry)].Inc()
		}
	case admission.Degraded:
		o.degraded[l].Inc()
	case admission.LimitChanged:
		o.limit.Set(float64(e.Limit))
	}
}

// b2i is 1 for true, 0 for false.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// lazyObserver is one series of a histogram vector, made at its first use.
type lazyObserver struct {
	once  sync.Once
	o     prometheus.Observer
	vec   *prometheus.HistogramVec
	label string
}

func (l *lazyObserver) get() prometheus.Observer {
	l.once.Do(func() { l.o = l.vec.WithLabelValues(l.label) })
	return l.o
}

var _ admission.Observer = (*AdmissionObserver)(nil)

// AdmissionState returns a collector that reads a Controller's Stats at
// scrape time: triage_admission_pending, _pending_cap, _executing,
// _queued, _away, _stalled, _service_seconds, _retry_ratio,
// triage_admission_signal_ratio{signal},
// triage_admission_forced_shed_ratio{criticality} (ForceShed drills) and
// the attempt histogram,
// triage_admission_attempts_total{criticality, attempt}.
func AdmissionState(ctl *admission.Controller) prometheus.Collector {
	return collector{[]*prometheus.Desc{descPending, descPendingCap, descExecuting, descQueued, descAway, descStalled, descService, descRetryShare, descSignal, descForced, descAttempts},
		func(ch chan<- prometheus.Metric) { collectAdmission(ctl, ch) }}
}

var (
	descPending    = prometheus.NewDesc("triage_admission_pending", "Requests admitted and not done (not yet started, waiting, running).", nil, nil)
	descPendingCap = prometheus.NewDesc("triage_admission_pending_cap", "Current bound on admitted requests (before criticality headroom), found by the controller.", nil, nil)
	descExecuting  = prometheus.NewDesc("triage_admission_executing", "Requests holding an execution slot.", nil, nil)
	descQueued     = prometheus.NewDesc("triage_admission_queued", "Requests waiting for an execution slot.", nil, nil)
	descAway       = prometheus.NewDesc("triage_admission_away", "Running requests waiting on a downstream call, without an execution slot (in pending).", nil, nil)
	descStalled    = prometheus.NewDesc("triage_admission_stalled", "Running requests waiting on their own client (a response it does not read, a message it does not send), without an execution slot (not in pending).", nil, nil)
	descService    = prometheus.NewDesc("triage_admission_service_seconds", "Mean service time of the last interval.", nil, nil)
	descRetryShare = prometheus.NewDesc("triage_admission_retry_ratio", "Share of retries among recent requests (the attempt histogram).", nil, nil)
	descSignal     = prometheus.NewDesc("triage_admission_signal_ratio", "Utilization signal value as a fraction of its target (1: at the target).", []string{"signal"}, nil)
	descForced     = prometheus.NewDesc("triage_admission_forced_shed_ratio", "Fraction of the criticality's requests a ForceShed drill rejects now (0: no drill).", []string{"criticality"}, nil)
	descAttempts   = prometheus.NewDesc("triage_admission_attempts_total", "Requests that arrived, by criticality and attempt counter (0: first attempt; 2: second retry or later): the attempt histogram the don't-retry rule reads (SRE book Figure 21-1).", []string{"criticality", "attempt"}, nil)
)

var attemptLabels = [admission.AttemptBuckets]string{"0", "1", "2"}

func collectAdmission(ctl *admission.Controller, ch chan<- prometheus.Metric) {
	st := ctl.Stats()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(descPending, float64(st.Pending))
	gauge(descPendingCap, float64(st.PendingCap))
	gauge(descExecuting, float64(st.Executing))
	gauge(descQueued, float64(st.Queued))
	gauge(descAway, float64(st.Away))
	gauge(descStalled, float64(st.Stalled))
	gauge(descService, st.ServiceTime.Seconds())
	gauge(descRetryShare, st.RetryShare)
	for name, u := range st.Signals {
		gauge(descSignal, u, name)
	}
	for l, f := range st.Forced {
		gauge(descForced, f, criticality.Level(l).String())
	}
	for l, row := range st.Attempts {
		for a, n := range row {
			ch <- prometheus.MustNewConstMetric(descAttempts, prometheus.CounterValue, float64(n), criticality.Level(l).String(), attemptLabels[a])
		}
	}
}
