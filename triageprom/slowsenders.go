package triageprom

import "github.com/prometheus/client_golang/prometheus"

// SlowSenderCounter is what SlowSenders reads: a *triagegrpc.Server.
type SlowSenderCounter interface{ SlowSenderRefusals() uint64 }

// SlowSenders returns a collector that reads, at scrape time,
// triage_slow_sender_refusals_total: the streams a gRPC server's tap
// refused as a slow sender's (triagegrpc.Server.SlowSenderRefusals), which
// admission control's rejection counters do not include.
func SlowSenders(s SlowSenderCounter) prometheus.Collector { return slowCollector{s} }

type slowCollector struct{ s SlowSenderCounter }

var descSlowRefused = prometheus.NewDesc("triage_slow_sender_refusals_total",
	"Streams refused at arrival because their connection sent messages past the message timeout (a slow sender's penalty or probation).", nil, nil)

func (c slowCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descSlowRefused }

func (c slowCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descSlowRefused, prometheus.CounterValue, float64(c.s.SlowSenderRefusals()))
}
