package triagesidecar

import (
	"encoding/base64"
	"math"
	"net/http"
	"testing"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"
	"google.golang.org/protobuf/proto"

	"github.com/triagehq/triage/wire"
)

func binReport(t testing.TB, r *v3orcapb.OrcaLoadReport, enc *base64.Encoding) string {
	b, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return enc.EncodeToString(b)
}

// Every form of ORCA's report an upstream may send is read, the
// application utilization before the CPU's, and a report that is not one
// is no reading.
func TestUpstreamLoadReadsEveryForm(t *testing.T) {
	padded := binReport(t, &v3orcapb.OrcaLoadReport{ApplicationUtilization: 0.7, CpuUtilization: 0.2}, base64.StdEncoding)
	raw := binReport(t, &v3orcapb.OrcaLoadReport{CpuUtilization: 0.25}, base64.RawStdEncoding)
	nan := binReport(t, &v3orcapb.OrcaLoadReport{ApplicationUtilization: math.NaN()}, base64.StdEncoding)
	for _, tc := range []struct {
		name string
		h    http.Header
		want float64
		ok   bool
	}{
		{"none", http.Header{}, 0, false},
		{"text", http.Header{wire.LoadReportHeader: {"TEXT cpu_utilization=0.3, application_utilization=0.9, named_metrics.queue=4"}}, 0.9, true},
		{"text, cpu only", http.Header{wire.LoadReportHeader: {"TEXT cpu_utilization=0.35,mem_utilization=0.5"}}, 0.35, true},
		{"text, nothing but named", http.Header{wire.LoadReportHeader: {"TEXT named_metrics.queue=4"}}, 0, true},
		{"text, twice", http.Header{wire.LoadReportHeader: {"TEXT cpu_utilization=0.3, cpu_utilization=0.9"}}, 0, false},
		{"text, unknown metric", http.Header{wire.LoadReportHeader: {"TEXT load=0.3"}}, 0, false},
		{"text, empty named", http.Header{wire.LoadReportHeader: {"TEXT named_metrics.=1"}}, 0, false},
		{"text, not a number", http.Header{wire.LoadReportHeader: {"TEXT cpu_utilization=high"}}, 0, false},
		{"text, NaN", http.Header{wire.LoadReportHeader: {"TEXT application_utilization=NaN"}}, 0, false},
		{"text, infinite", http.Header{wire.LoadReportHeader: {"TEXT cpu_utilization=+Inf"}}, 0, false},
		{"text, colon", http.Header{wire.LoadReportHeader: {"TEXT cpu_utilization:0.3"}}, 0, false},
		{"text, negative", http.Header{wire.LoadReportHeader: {"TEXT cpu_utilization=-0.3"}}, 0, false},
		{"json", http.Header{wire.LoadReportHeader: {`JSON {"cpu_utilization": 0.4, "applicationUtilization": 0.6, "unknown": 1}`}}, 0.6, true},
		{"json, broken", http.Header{wire.LoadReportHeader: {`JSON {"cpu_utilization": `}}, 0, false},
		{"bin in the text header", http.Header{wire.LoadReportHeader: {"BIN " + padded}}, 0.7, true},
		{"bin header", http.Header{wire.LoadReportBinHeader: {raw}}, 0.25, true},
		{"bin trailer", http.Header{http.TrailerPrefix + wire.LoadReportBinHeader: {padded}}, 0.7, true},
		{"bin, not base64", http.Header{wire.LoadReportBinHeader: {"%%%"}}, 0, false},
		{"bin, not a report", http.Header{wire.LoadReportBinHeader: {base64.StdEncoding.EncodeToString([]byte{0xff, 0xff})}}, 0, false},
		{"bin, NaN", http.Header{wire.LoadReportBinHeader: {nan}}, 0, false},
		{"unknown form", http.Header{wire.LoadReportHeader: {"YAML cpu_utilization: 0.3"}}, 0, false},
		{"two headers", http.Header{wire.LoadReportHeader: {"TEXT cpu_utilization=0.3", "TEXT cpu_utilization=0.4"}}, 0, false},
	} {
		u, ok := upstreamLoad(tc.h)
		if ok != tc.ok || ok && u != tc.want {
			t.Errorf("%s: %v, %v; want %v, %v", tc.name, u, ok, tc.want, tc.ok)
		}
	}
}

// FuzzUpstreamLoad: whatever an upstream sends, reading it neither panics
// nor gives a reading that is not a finite utilization at least 0.
func FuzzUpstreamLoad(f *testing.F) {
	f.Add("TEXT cpu_utilization=0.3, application_utilization=0.9", "")
	f.Add(`JSON {"cpuUtilization": 0.4}`, "")
	f.Add("", binReport(f, &v3orcapb.OrcaLoadReport{ApplicationUtilization: 0.7}, base64.StdEncoding))
	f.Fuzz(func(t *testing.T, text, bin string) {
		h := http.Header{}
		if text != "" {
			h[wire.LoadReportHeader] = []string{text}
		}
		if bin != "" {
			h[wire.LoadReportBinHeader] = []string{bin}
		}
		if u, ok := upstreamLoad(h); ok && (!(u >= 0) || math.IsInf(u, 0)) {
			t.Fatalf("%q, %q: reading %v", text, bin, u)
		}
	})
}
