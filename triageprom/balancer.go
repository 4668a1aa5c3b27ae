package triageprom

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/triagehq/triage/balance"
)

// BalancerMetrics exports the state of load balancers (package balance):
// picks and active requests per backend, backend states and state changes,
// and weighted round robin's capability scores. It is a
// prometheus.Collector (register it once) and the tracker to pass to
// lb.Register(lb.WithMetrics(bm)).
//
// Series, labelled by target (the ClientConn's target) and backend (the
// endpoint's address): triage_balancer_picks_total,
// triage_balancer_active_requests, triage_balancer_weight,
// triage_balancer_backend_state{state} (1 for the current state),
// triage_balancer_state_changes_total{to}.
//
// It holds the balancers added and not removed, each with its subset: the
// series are bounded by the ClientConns and their subset sizes.
type BalancerMetrics struct {
	mu      sync.Mutex
	tracked map[*balance.Balancer]string
	changes *prometheus.CounterVec
}

// Balancers returns a BalancerMetrics.
func (m *Metrics) Balancers() *BalancerMetrics {
	return &BalancerMetrics{
		tracked: map[*balance.Balancer]string{},
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "triage_balancer_state_changes_total",
			Help: "Backend state changes seen by a client's load balancer, by target, backend and new state (healthy, refusing, lame_duck).",
		}, []string{"target", "backend", "to"}),
	}
}

// Add tracks b under target.
func (bm *BalancerMetrics) Add(target string, b *balance.Balancer) {
	bm.mu.Lock()
	bm.tracked[b] = target
	bm.mu.Unlock()
}

// Remove stops tracking b.
func (bm *BalancerMetrics) Remove(b *balance.Balancer) {
	bm.mu.Lock()
	delete(bm.tracked, b)
	bm.mu.Unlock()
}

// Observer returns the balance.Observer of a balancer of target: it counts
// state changes.
func (bm *BalancerMetrics) Observer(target string) balance.Observer {
	return stateChanges{bm: bm, target: target}
}

type stateChanges struct {
	balance.Nop
	bm     *BalancerMetrics
	target string
}

func (s stateChanges) StateChanged(e *balance.Endpoint, _, to balance.State) {
	s.bm.changes.WithLabelValues(s.target, e.ID(), to.String()).Inc()
}

var (
	descPicks  = prometheus.NewDesc("triage_balancer_picks_total", "Requests a client's load balancer sent to each backend.", []string{"target", "backend"}, nil)
	descActive = prometheus.NewDesc("triage_balancer_active_requests", "The client's active requests to each backend (flow control caps them).", []string{"target", "backend"}, nil)
	descWeight = prometheus.NewDesc("triage_balancer_weight", "Weighted round robin's capability score of each backend (0 before a usable load report).", []string{"target", "backend"}, nil)
	descState  = prometheus.NewDesc("triage_balancer_backend_state", "1 for each backend's current state as the client sees it.", []string{"target", "backend", "state"}, nil)
)

// Describe implements prometheus.Collector.
func (bm *BalancerMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPicks, descActive, descWeight, descState} {
		ch <- d
	}
	bm.changes.Describe(ch)
}

// Collect implements prometheus.Collector.
func (bm *BalancerMetrics) Collect(ch chan<- prometheus.Metric) {
	bm.mu.Lock()
	tracked := make(map[*balance.Balancer]string, len(bm.tracked))
	for b, t := range bm.tracked {
		tracked[b] = t
	}
	bm.mu.Unlock()
	for b, target := range tracked {
		for _, e := range b.Endpoints() {
			ch <- prometheus.MustNewConstMetric(descPicks, prometheus.CounterValue, float64(e.Picks()), target, e.ID())
			ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(e.Active()), target, e.ID())
			ch <- prometheus.MustNewConstMetric(descWeight, prometheus.GaugeValue, e.Weight(), target, e.ID())
			for _, s := range []balance.State{balance.Refusing, balance.Healthy, balance.LameDuck, balance.Unresponsive} {
				v := 0.0
				if e.State() == s {
					v = 1
				}
				ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, v, target, e.ID(), s.String())
			}
		}
	}
	bm.changes.Collect(ch)
}
