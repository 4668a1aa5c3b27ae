package app

import (
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"

	"github.com/triagehq/triage/lifecycle"
	"github.com/triagehq/triage/triagehttp"
)

// newRegistry is a serving command's registry: the Go runtime's and the
// process's own metrics (go_goroutines, process_resident_memory_bytes,
// ...), for the dashboards and soak tests that watch them.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// serveMetrics serves reg's metrics on addr (at every path but the
// probes'), and with a lifecycle its probes: triagehttp.ReadyPath (200,
// or 503 in lame duck) and triagehttp.LivePath (200), or those of p. An
// orchestrator's prober (a kubelet) reaches them there without the client
// certificate the serving address asks for; the metrics listener is
// meant for the pod's network only.
func serveMetrics(addr string, reg *prometheus.Registry, lc *lifecycle.Lifecycle, p ...probes) (func(), error) {
	ml, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if lc != nil {
		pr := probes{ready: triagehttp.ReadyPath, live: triagehttp.LivePath}
		if len(p) > 0 {
			pr = p[0]
		}
		if pr.readyH == nil {
			pr.readyH = triagehttp.HealthHandler(lc)
		}
		mux.Handle(pr.ready, pr.readyH)
		mux.Handle(pr.live, triagehttp.LivenessHandler())
	}
	hs := metricsServer(mux, metricsLimits)
	go hs.Serve(netutil.LimitListener(ml, metricsLimits.conns))
	return func() { hs.Close() }, nil
}

// limits bound what one peer of the metrics and probe listener can hold:
// its connections at once, the time to send a request, to take the
// answer, and to stay idle between requests.
type limits struct {
	conns                     int
	header, read, write, idle time.Duration
}

// metricsLimits are the metrics listener's: scrapers and probes are few,
// fast and on the node, so a peer that holds more is not one of them.
var metricsLimits = limits{conns: 64, header: 5 * time.Second, read: 10 * time.Second, write: 30 * time.Second, idle: time.Minute}

// metricsServer serves h within l.
func metricsServer(h http.Handler, l limits) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.header, ReadTimeout: l.read, WriteTimeout: l.write,
		IdleTimeout: l.idle, MaxHeaderBytes: 16 << 10}
}
