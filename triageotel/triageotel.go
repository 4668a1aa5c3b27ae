// Package triageotel reports what triage's mechanisms do through
// OpenTelemetry: as metrics, every series package triageprom exports with
// the same meaning, and on each request's span, what was decided about
// it.
//
// Metrics implements the same core observers as triageprom.Metrics
// (edge.Observer; Admission for admission.Observer; Client for
// retry.Observer; Shadow for shadow.Observer; Balancers for lb.Tracker),
// and registers callbacks for the state read at collection (AdmissionState,
// Quota, QuotaService, QuotaReplica, ConnLoad, SlowSenders). Tracer
// records, on the request's span, its criticality, attempt, client type
// and (opt-in) customer, and an event for each decision. Both take their
// provider from the caller; nothing is registered globally:
//
//	m, _ := triageotel.New(meterProvider)
//	tr := triageotel.NewTracer(tracerProvider)
//	srv, _ := triagegrpc.NewServer(triagegrpc.WithIntake(intake.WithTracer(tr.Intake())), ...)
//	cl, _ := edge.New(cfg, edge.WithObserver(m))
//
// Instruments are named triage.* with attributes criticality, reason and
// so on: through a Prometheus exporter each becomes its triageprom series,
// name and labels; Names maps each to its series.
// Counters resolve their attribute sets when an observer is made, so
// counting on the request path does not allocate, and report every
// series from then on, at 0 until counted (as triageprom does: an alert
// on a rate sees 0, not an absent series).
//
// It is a module of its own, so that the library's users who do not use
// OpenTelemetry never download it.
package triageotel

import (
	"context"
	"errors"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/wire"
)

// scope is the instrumentation scope's name.
const scope = "github.com/triagehq/triage/triageotel"

// Attribute keys.
const (
	keyCriticality = attribute.Key("criticality")
	keyRule        = attribute.Key("rule")
	keyTrusted     = attribute.Key("trusted")
	keyKey         = attribute.Key("key")
	keyReason      = attribute.Key("reason")
	keyAnswer      = attribute.Key("answer")
	keyTarget      = attribute.Key("target")
	keyMechanism   = attribute.Key("mechanism")
	keySignal      = attribute.Key("signal")
	keyAttempt     = attribute.Key("attempt")
	keyCustomer    = attribute.Key("customer")
	keyBackend     = attribute.Key("backend")
	keyState       = attribute.Key("state")
	keyTo          = attribute.Key("to")
	keyLeader      = attribute.Key("leader")
)

// Metrics implements the core observers with OpenTelemetry instruments.
// It is safe for concurrent use. Its attribute sets are fixed when New
// runs (4 criticalities x 5 rules x 2 trust states, plus one per
// registered key, plus those of shadow mode), plus 28 per client target
// passed to Client; the collected state is bounded as triageprom's is.
type Metrics struct {
	meter metric.Meter

	edgeRequests metric.Int64Counter
	invalid      metric.Int64Counter
	stripped     metric.Int64Counter
	byDecision   [criticality.NumLevels][5][2]metric.AddOption
	strippedKeys map[string]metric.AddOption
	strippedMisc metric.AddOption

	client clientInstruments
	adm    admissionInstruments
	shadow shadowInstruments

	customers bool
}

// An Option configures Metrics.
type Option func(*Metrics)

// WithCustomers gives the quota instruments a customer attribute
// (Quota's and QuotaService's), as triageprom.WithCustomers labels its
// series. Default: off (a customer's name can identify a person or a
// tenant): usage and demand are summed over the customers.
func WithCustomers() Option { return func(m *Metrics) { m.customers = true } }

// New returns Metrics whose instruments come from mp's meter for this
// package. It returns the first error the meter gives.
func New(mp metric.MeterProvider, opts ...Option) (*Metrics, error) {
	if mp == nil {
		return nil, errors.New("triageotel: a nil MeterProvider")
	}
	m := &Metrics{meter: mp.Meter(scope), strippedKeys: map[string]metric.AddOption{}}
	for _, o := range opts {
		o(m)
	}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	m.edgeRequests = counter("triage.edge.requests", "{request}", "Requests classified at the edge or an internal hop, by assigned criticality, deciding rule (header, host, path, group, default) and whether the peer was trusted.")
	m.invalid = counter("triage.edge.invalid_header", "{request}", "Requests from trusted peers whose criticality header was malformed and ignored.")
	m.stripped = counter("triage.untrusted_keys_stripped", "{key}", "Triage metadata keys or headers sent by untrusted peers and removed, by key (registered name, or 'unregistered').")
	for _, l := range criticality.All() {
		for r := range m.byDecision[l] {
			for t := range m.byDecision[l][r] {
				m.byDecision[l][r][t] = addSet(keyCriticality.String(l.String()), keyRule.String(edge.RuleKind(r).String()), keyTrusted.Bool(t == 1))
			}
		}
	}
	for _, k := range wire.Keys() {
		m.strippedKeys[k.Name] = addSet(keyKey.String(k.Name))
	}
	m.strippedMisc = addSet(keyKey.String("unregistered"))
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, l := range m.byDecision {
		for _, r := range l {
			for _, o := range r {
				m.edgeRequests.Add(bg, 0, o)
			}
		}
	}
	for _, o := range m.strippedKeys {
		m.stripped.Add(bg, 0, o)
	}
	m.stripped.Add(bg, 0, m.strippedMisc)
	m.invalid.Add(bg, 0)
	m.client = newClientInstruments(counter)
	m.adm = newAdmissionInstruments(m.meter, counter, &errs)
	m.shadow = newShadowInstruments(counter)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	m.adm.limit.Record(bg, 0)
	m.shadow.zero()
	return m, nil
}

// addSet is the option that adds to the series of attrs.
func addSet(attrs ...attribute.KeyValue) metric.AddOption {
	return metric.WithAttributeSet(attribute.NewSet(attrs...))
}

// bg is the context of observer calls, which have none.
var bg = context.Background()

// Classified implements edge.Observer.
func (m *Metrics) Classified(d edge.Decision) {
	if !d.Level.Valid() || int(d.Rule) >= len(m.byDecision[0]) {
		return
	}
	t := 0
	if d.Trusted {
		t = 1
	}
	m.edgeRequests.Add(bg, 1, m.byDecision[d.Level][d.Rule][t])
	if d.InvalidHeader {
		m.invalid.Add(bg, 1)
	}
}

// Stripped implements edge.Observer.
func (m *Metrics) Stripped(key string) {
	if o, ok := m.strippedKeys[key]; ok {
		m.stripped.Add(bg, 1, o)
		return
	}
	m.stripped.Add(bg, 1, m.strippedMisc)
}

var _ edge.Observer = (*Metrics)(nil)

func lvl(l criticality.Level) criticality.Level {
	if !l.Valid() {
		return criticality.Default
	}
	return l
}

func itoa(n int) string { return strconv.Itoa(n) }
