package triagegrpc

import (
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/orca"

	"github.com/triagehq/triage/loadreport"
	"github.com/triagehq/triage/wire"
)

// RegisterLoadReportService serves ORCA's out-of-band load reports
// (xds.service.orca.v3.OpenRcaService, with grpc-go's orca package) on s
// from m: the load WithLoadReports puts in every response's trailer,
// streamed to clients that carry no calls yet (SRE book ch. 20: backends
// report their load "including responses to health checks"). Stock
// weighted_round_robin with enableOobLoadReport and the "triage" balancer
// with oobLoadReport subscribe to it. A subscriber gets a report at once,
// then at the interval it asks for, no more often than grpc-go's orca
// package allows (every 30 s).
func RegisterLoadReportService(s grpc.ServiceRegistrar, m *loadreport.Meter) error {
	if m == nil {
		return errors.New("triagegrpc: RegisterLoadReportService needs a Meter")
	}
	return orca.Register(s, orca.ServiceOptions{ServerMetricsProvider: meterMetrics{m}})
}

// meterMetrics reads a Meter as ORCA's server metrics, the fields the
// trailer carries.
type meterMetrics struct{ m *loadreport.Meter }

func (p meterMetrics) ServerMetrics() *orca.ServerMetrics {
	l := p.m.Load()
	return &orca.ServerMetrics{
		CPUUtilization: l.Utilization, AppUtilization: l.Utilization, MemUtilization: -1,
		QPS: l.QPS, EPS: l.EPS,
		Utilization: map[string]float64{}, RequestCost: map[string]float64{}, NamedMetrics: map[string]float64{wire.ReportSpanMetric: l.Span.Seconds()},
	}
}
