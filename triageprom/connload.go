package triageprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/triagehq/triage/connload"
)

// ConnLoadState returns a collector that reads a connload.Listener's Stats
// at scrape time (SRE book ch. 21, "Load from Connections"):
// triage_connections_open, triage_connections_accepted_total,
// triage_connections_delayed_total (accepts that waited for the accept
// rate or the maximum open), triage_connections_busy (open
// connections carrying a call now; the rest of the open ones are idle;
// counted for servers that report calls, such as gRPC servers with
// triagegrpc.WithConnLoad), and triage_health_checks_total (health checks
// answered). Rates are the counters' rate() in PromQL.
func ConnLoadState(l *connload.Listener) prometheus.Collector {
	return collector{[]*prometheus.Desc{descConnOpen, descConnAccepted, descConnDelayed, descConnBusy, descHealthChecks}, func(ch chan<- prometheus.Metric) {
		s := l.Stats()
		ch <- prometheus.MustNewConstMetric(descConnOpen, prometheus.GaugeValue, float64(s.Open))
		ch <- prometheus.MustNewConstMetric(descConnAccepted, prometheus.CounterValue, float64(s.Accepted))
		ch <- prometheus.MustNewConstMetric(descConnDelayed, prometheus.CounterValue, float64(s.Delayed))
		ch <- prometheus.MustNewConstMetric(descConnBusy, prometheus.GaugeValue, float64(s.Busy))
		ch <- prometheus.MustNewConstMetric(descHealthChecks, prometheus.CounterValue, float64(s.HealthChecks))
	}}
}

var (
	descConnOpen     = prometheus.NewDesc("triage_connections_open", "Connections open now.", nil, nil)
	descConnAccepted = prometheus.NewDesc("triage_connections_accepted_total", "Connections accepted.", nil, nil)
	descConnDelayed  = prometheus.NewDesc("triage_connections_delayed_total", "Connections that waited for the accept rate or the maximum open before being accepted.", nil, nil)
	descConnBusy     = prometheus.NewDesc("triage_connections_busy", "Open connections carrying a call now (the others are idle).", nil, nil)
	descHealthChecks = prometheus.NewDesc("triage_health_checks_total", "Health checks answered (checks, and health watches opened).", nil, nil)
)
