package triageprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/shadow"
)

// shadowMetrics holds triage_shadow_would_refuse_total, every series
// created at New: one per mechanism, reason and criticality
// (shadow.Reasons: 44).
type shadowMetrics struct {
	vec *prometheus.CounterVec
	c   [shadow.NumMechanisms][][criticality.NumLevels]prometheus.Counter
}

func newShadowMetrics() shadowMetrics {
	s := shadowMetrics{vec: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "triage_shadow_would_refuse_total",
		Help: "Requests a mechanism in shadow mode would have refused and let through, by mechanism (admission, quota, isolation, connection, throttle, retry-budget), reason and criticality.",
	}, []string{"mechanism", "reason", "criticality"})}
	for m := range shadow.NumMechanisms {
		s.c[m] = make([][criticality.NumLevels]prometheus.Counter, len(shadow.Reasons[m]))
		for r, name := range shadow.Reasons[m] {
			for _, l := range criticality.All() {
				s.c[m][r][l] = s.vec.WithLabelValues(m.String(), name, l.String())
			}
		}
	}
	return s
}

// Shadow returns the observer to pass to the shadow options
// (intake.WithShadow, given to triagegrpc.WithIntake or triagehttp.WithIntake,
// retry.WithShadow). Series: triage_shadow_would_refuse_total{mechanism,
// reason, criticality}.
func (m *Metrics) Shadow() shadow.Observer { return &m.shadow }

// WouldRefuse implements shadow.Observer.
func (s *shadowMetrics) WouldRefuse(m shadow.Mechanism, reason string, l criticality.Level) {
	if m >= shadow.NumMechanisms || !l.Valid() {
		return
	}
	for r, name := range shadow.Reasons[m] {
		if name == reason {
			s.c[m][r][l].Inc()
			return
		}
	}
}
