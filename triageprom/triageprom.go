// Package triageprom exports what triage's mechanisms do as Prometheus
// metrics, for operators: "throttling as a signal" (the CRE post) starts with
// seeing who is being classified, shed and rejected.
//
// Core packages report through small observer interfaces (edge.Observer,
// ...) with no-op defaults and know nothing of Prometheus. A Metrics value
// implements those observers and prometheus.Collector; register it yourself:
//
//	m := triageprom.New()
//	reg.MustRegister(m)
//	cl, _ := edge.New(cfg, edge.WithObserver(m))
//
// Nothing is registered globally. Every metric is named triage_* and
// labelled by criticality where it applies. Counters are resolved when New
// runs, so reporting on the request path does not allocate.
package triageprom

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/wire"
)

// Metrics implements the core observers and prometheus.Collector. It is
// safe for concurrent use; its series are fixed when New runs (4
// criticalities x 5 rules x 2 trust states, plus one per registered key,
// plus 44 of shadow mode), plus 28 per client target passed to Client.
type Metrics struct {
	edgeRequests *prometheus.CounterVec
	invalid      prometheus.Counter
	stripped     *prometheus.CounterVec

	byDecision   [criticality.NumLevels][5][2]prometheus.Counter
	strippedKeys map[string]prometheus.Counter
	strippedMisc prometheus.Counter

	client clientVecs

	admAdmitted *prometheus.CounterVec
	admRejected *prometheus.CounterVec
	admDegraded *prometheus.CounterVec
	admWait     *prometheus.HistogramVec
	admLimit    prometheus.Gauge

	shadow shadowMetrics

	customers bool
}

// An Option configures Metrics.
type Option func(*Metrics)

// WithCustomers labels the quota series by customer (Quota's and
// QuotaService's). Default: off, since a customer's name can identify a
// person or a tenant and the series multiply by the customers tracked
// (at most a usage.Table's MaxTracked plus one): usage and demand are then
// summed over the customers, refusals counted by criticality, and a
// customer's limits not exported.
func WithCustomers() Option { return func(m *Metrics) { m.customers = true } }

// New returns Metrics with every series created at zero.
func New(opts ...Option) *Metrics {
	m := &Metrics{
		edgeRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "triage_edge_requests_total",
			Help: "Requests classified at the edge or an internal hop, by assigned criticality, deciding rule (header, host, path, group, default) and whether the peer was trusted.",
		}, []string{"criticality", "rule", "trusted"}),
		invalid: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "triage_edge_invalid_header_total",
			Help: "Requests from trusted peers whose criticality header was malformed and ignored.",
		}),
		stripped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "triage_untrusted_keys_stripped_total",
			Help: "Triage metadata keys or headers sent by untrusted peers and removed, by key (registered name, or 'unregistered').",
		}, []string{"key"}),
		strippedKeys: map[string]prometheus.Counter{},
		client:       newClientVecs(),
		admAdmitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "triage_admission_admitted_total",
			Help: "Requests given an execution slot by admission control, by criticality.",
		}, []string{"criticality"}),
		admRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "triage_admission_rejected_total",
			Help: "Requests rejected by admission control, by criticality, reason (concurrency, utilization, deadline) and answer (task-overloaded, overloaded-dont-retry).",
		}, []string{"criticality", "reason", "answer"}),
		admWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "triage_admission_wait_seconds",
			Help: "Time a request waited in admission control's queue for its execution slot (0 for one that got it at once), by criticality.",
			// Classic buckets around the target delay and the max wait,
			// and a native histogram for a Prometheus that takes one.
			Buckets:                        []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5},
			NativeHistogramBucketFactor:    1.1,
			NativeHistogramMaxBucketNumber: 100,
		}, []string{"criticality"}),
		admDegraded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "triage_admission_degraded_total",
			Help: "Requests told by admission control to serve a degraded answer, by criticality.",
		}, []string{"criticality"}),
		admLimit: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "triage_admission_limit",
			Help: "Execution limit found by admission control.",
		}),
	}
	for _, l := range criticality.All() {
		for r := range m.byDecision[l] {
			for t := range m.byDecision[l][r] {
				m.byDecision[l][r][t] = m.edgeRequests.WithLabelValues(l.String(), edge.RuleKind(r).String(), strconv.FormatBool(t == 1))
			}
		}
	}
	for _, k := range wire.Keys() {
		m.strippedKeys[k.Name] = m.stripped.WithLabelValues(k.Name)
	}
	m.strippedMisc = m.stripped.WithLabelValues("unregistered")
	m.shadow = newShadowMetrics()
	for _, o := range opts {
		o(m)
	}
	return m
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.edgeRequests.Describe(ch)
	m.invalid.Describe(ch)
	m.stripped.Describe(ch)
	m.client.each(func(v *prometheus.CounterVec) { v.Describe(ch) })
	m.admAdmitted.Describe(ch)
	m.admRejected.Describe(ch)
	m.admDegraded.Describe(ch)
	m.admWait.Describe(ch)
	m.admLimit.Describe(ch)
	m.shadow.vec.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.edgeRequests.Collect(ch)
	m.invalid.Collect(ch)
	m.stripped.Collect(ch)
	m.client.each(func(v *prometheus.CounterVec) { v.Collect(ch) })
	m.admAdmitted.Collect(ch)
	m.admRejected.Collect(ch)
	m.admDegraded.Collect(ch)
	m.admWait.Collect(ch)
	m.admLimit.Collect(ch)
	m.shadow.vec.Collect(ch)
}

// Classified implements edge.Observer.
func (m *Metrics) Classified(d edge.Decision) {
	if !d.Level.Valid() || int(d.Rule) >= len(m.byDecision[0]) {
		return
	}
	t := 0
	if d.Trusted {
		t = 1
	}
	m.byDecision[d.Level][d.Rule][t].Inc()
	if d.InvalidHeader {
		m.invalid.Inc()
	}
}

// Stripped implements edge.Observer.
func (m *Metrics) Stripped(key string) {
	if c, ok := m.strippedKeys[key]; ok {
		c.Inc()
		return
	}
	m.strippedMisc.Inc()
}

var _ edge.Observer = (*Metrics)(nil)

// collector is a prometheus.Collector of fixed descriptions whose
// metrics collect makes at scrape time.
type collector struct {
	descs   []*prometheus.Desc
	collect func(ch chan<- prometheus.Metric)
}

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }
