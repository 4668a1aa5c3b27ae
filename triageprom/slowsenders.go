package triageprom

import "github.com/prometheus/client_golang/prometheus"

// SlowSenderCounter is what SlowSenders reads: a *triagegrpc.Server.
type SlowSenderCounter interface{ SlowSenderRefusals() uint64 }

// SlowSenders returns a collector that reads, at scrape time,
// triage_slow_sender_refusals_total: the streams a gRPC server's tap
// refused as a slow sender's (triagegrpc.Server.SlowSenderRefusals), which
// admission control's rejection counters do not include.
func SlowSenders(s SlowSenderCounter) prometheus.Collector {
	return collector{[]*prometheus.Desc{descSlowRefused}, func(ch chan<- prometheus.Metric) {
		ch <- prometheus.MustNewConstMetric(descSlowRefused, prometheus.CounterValue, float64(s.SlowSenderRefusals()))
	}}
}

var descSlowRefused = prometheus.NewDesc("triage_slow_sender_refusals_total",
	"Streams refused at arrival because their connection sent messages past the message timeout (a slow sender's penalty or probation).", nil, nil)
