package triagesidecar

import (
	"encoding/base64"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/triagehq/triage/signals"
	"github.com/triagehq/triage/wire"
)

// DefaultUpstreamLoadAge is how long an upstream's load report counts, in
// the signal `triage sidecar` gives WithUpstreamLoad: long enough to span
// the gaps between a loaded upstream's answers, short enough that a
// report nobody renews stops shedding within seconds.
const DefaultUpstreamLoadAge = 2 * time.Second

// WithUpstreamLoad gives Ingress a signal to set from the load the
// upstream reports with its answers, ORCA's load report as Envoy reads it
// (wire.LoadReportHeader: "TEXT name=value, ...", "JSON {...}" or
// "BIN base64"; or wire.LoadReportBinHeader, in the header or a gRPC
// trailer): its application utilization, else its CPU utilization, the
// figure triage's balancer weighs backends by. Give the same signal to
// the admission controller (admission.WithSignal) so that it sheds by
// the upstream's own measure of its load, lower criticalities first: for
// a report that passes 1 only when the upstream is past its capacity, not
// one that is 1 whenever it is busy (docs/sidecar.md). An answer without a report, or with one that does not parse, leaves the
// signal as it was; the report still reaches the caller. Default: none.
func WithUpstreamLoad(s *signals.Reported) Option {
	return optionFunc(func(c *config) { c.load = s })
}

// reportsLoad sets load from the report of each answer next gives, which
// it finds in w's header map once next has returned (httputil's
// ReverseProxy leaves the upstream's header and trailers there).
func reportsLoad(next http.Handler, load *signals.Reported) http.Handler {
	if load == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		if u, ok := upstreamLoad(w.Header()); ok {
			load.Set(u)
		}
	})
}

// upstreamLoad reads the utilization an upstream's answer reports in h:
// ok is false without a report, or with one that does not parse or gives
// a figure that is not a finite number at least 0.
func upstreamLoad(h http.Header) (u float64, ok bool) {
	if v := h[wire.LoadReportHeader]; len(v) == 1 {
		kind, body, _ := strings.Cut(v[0], " ")
		switch kind {
		case "TEXT":
			return textLoad(body)
		case "JSON":
			var r v3orcapb.OrcaLoadReport
			if (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(body), &r) != nil {
				return 0, false
			}
			return reportLoad(&r)
		case "BIN":
			return binLoad(body)
		}
		return 0, false
	}
	for _, k := range [...]string{wire.LoadReportBinHeader, http.TrailerPrefix + wire.LoadReportBinHeader} {
		if v := h[k]; len(v) == 1 {
			return binLoad(v[0])
		}
	}
	return 0, false
}

// textLoad reads "name=value, name=value": ORCA's metric names
// (application_utilization, cpu_utilization, mem_utilization, eps,
// rps_fractional, named_metrics.NAME), each once, each value a finite
// number.
func textLoad(s string) (float64, bool) {
	var app, cpu float64
	seen := 0
	for s != "" {
		var pair string
		pair, s, _ = strings.Cut(s, ",")
		name, value, ok := strings.Cut(strings.TrimSpace(pair), "=")
		f, err := strconv.ParseFloat(value, 64)
		if !ok || name == "" || err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, false
		}
		bit := 0
		switch name {
		case "application_utilization":
			app, bit = f, 1
		case "cpu_utilization":
			cpu, bit = f, 2
		case "mem_utilization", "eps", "rps_fractional":
		default:
			if !strings.HasPrefix(name, "named_metrics.") || len(name) == len("named_metrics.") {
				return 0, false
			}
		}
		if seen&bit != 0 {
			return 0, false // twice
		}
		seen |= bit
	}
	return utilization(app, cpu)
}

// binLoad reads a report serialized and base64-encoded, padded or not.
func binLoad(s string) (float64, bool) {
	b, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(s, "="))
	if err != nil {
		return 0, false
	}
	var r v3orcapb.OrcaLoadReport
	if proto.Unmarshal(b, &r) != nil {
		return 0, false
	}
	return reportLoad(&r)
}

func reportLoad(r *v3orcapb.OrcaLoadReport) (float64, bool) {
	return utilization(r.GetApplicationUtilization(), r.GetCpuUtilization())
}

// utilization is the application utilization, else the CPU's, if it is a
// finite number at least 0 (lb's loadOf reads a report the same way).
func utilization(app, cpu float64) (float64, bool) {
	u := app
	if u <= 0 {
		u = cpu
	}
	return u, u >= 0 && !math.IsInf(u, 0)
}
