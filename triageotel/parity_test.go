package triageotel_test

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/triagehq/triage/quota/allocate"
	"github.com/triagehq/triage/quota/usage"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/triagehq/triage/admission"
	"github.com/triagehq/triage/balance"
	"github.com/triagehq/triage/clock"
	"github.com/triagehq/triage/connload"
	"github.com/triagehq/triage/cost"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/edge"
	"github.com/triagehq/triage/intake"
	"github.com/triagehq/triage/outcome"
	"github.com/triagehq/triage/quota"
	"github.com/triagehq/triage/retry"
	"github.com/triagehq/triage/shadow"
	"github.com/triagehq/triage/triagehttp"
	"github.com/triagehq/triage/triageotel"
	"github.com/triagehq/triage/triageprom"
	"github.com/triagehq/triage/trust"
)

// both are the two adapters, fed the same events.
type both struct {
	prom   *triageprom.Metrics
	reg    *prometheus.Registry
	otel   *triageotel.Metrics
	reader *sdkmetric.ManualReader
	// exported is what OpenTelemetry's Prometheus exporter makes of
	// otel's instruments, as a collector's Prometheus exporter does.
	exported *prometheus.Registry
}

func newBoth(t *testing.T, customers bool) *both {
	t.Helper()
	var po []triageprom.Option
	var oo []triageotel.Option
	if customers {
		po, oo = append(po, triageprom.WithCustomers()), append(oo, triageotel.WithCustomers())
	}
	b := &both{prom: triageprom.New(po...), reg: prometheus.NewPedanticRegistry(), reader: sdkmetric.NewManualReader(),
		exported: prometheus.NewRegistry()}
	b.reg.MustRegister(b.prom)
	exporter, err := otelprom.New(otelprom.WithRegisterer(b.exported))
	if err != nil {
		t.Fatal(err)
	}
	om, err := triageotel.New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(b.reader), sdkmetric.WithReader(exporter)), oo...)
	if err != nil {
		t.Fatal(err)
	}
	b.otel = om
	return b
}

// tracker tells both balancer trackers.
type tracker struct {
	p *triageprom.BalancerMetrics
	o *triageotel.BalancerMetrics
}

func (t tracker) Observer(target string) balance.Observer {
	return observers{t.p.Observer(target), t.o.Observer(target)}
}

type observers []balance.Observer

func (os observers) Picked(e *balance.Endpoint) {
	for _, o := range os {
		o.Picked(e)
	}
}

func (os observers) StateChanged(e *balance.Endpoint, from, to balance.State) {
	for _, o := range os {
		o.StateChanged(e, from, to)
	}
}

func (os observers) WeightsUpdated(b *balance.Balancer) {
	for _, o := range os {
		o.WeightsUpdated(b)
	}
}

// replica is a quota service replica's state as the metrics read it.
type replica struct{ a *allocate.Allocator }

func (r replica) Leader() (string, bool)         { return "127.0.0.1:7080", true }
func (r replica) IsLeader() bool                 { return true }
func (r replica) Elections() uint64              { return 3 }
func (r replica) PolicyVersion() int64           { return 42 }
func (r replica) Allocator() *allocate.Allocator { return r.a }

// fixedSignal is a utilization signal that reads a constant.
type fixedSignal float64

func (f fixedSignal) Name() string         { return "fixed" }
func (f fixedSignal) Utilization() float64 { return float64(f) }

type slow uint64

func (s slow) SlowSenderRefusals() uint64 { return uint64(s) }

// The same load through both adapters gives the same value in every
// Prometheus series and its OpenTelemetry data point: a net/http server
// over loopback with admission control (one slot, no queue), a quota
// (one customer over its hard limit, refused), a classifier with a path rule, a
// second server with admission in shadow mode, and clients through retry
// policies; a balancer; a connection listener; the quota service and a
// replica. Every series triageprom exports has a data point, and every
// data point a series.
func TestParity(t *testing.T) {
	b := newBoth(t, true)
	clk := clock.Real()
	cl, err := edge.New(edge.Config{Rules: []edge.RuleConfig{{PathPrefix: "/batch", Criticality: "SHEDDABLE"}, {Header: true}}},
		edge.WithObserver(edge.Tee(b.prom, b.otel)))
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := admission.New(admission.WithObserver(b.prom.Admission(), b.otel.Admission()),
		admission.WithLimits(1, 1, 1), admission.WithQueueFactor(0), admission.WithMaxWait(20*time.Millisecond),
		admission.WithSignal(fixedSignal(0.25), admission.DefaultThresholds()))
	if err != nil {
		t.Fatal(err)
	}
	b.reg.MustRegister(triageprom.AdmissionState(ctl))
	if _, err := b.otel.AdmissionState(ctl); err != nil {
		t.Fatal(err)
	}
	pol, _ := quota.New(quota.Config{Customers: map[string]quota.Limit{"ads": {CPU: 0.000001, Hard: true}}})
	table, _ := usage.New()
	table.Add("ads", criticality.Sheddable, time.Second) // "ads" is over its hard limit: its requests are refused out of quota
	enf, _ := quota.NewEnforcer(pol, table)
	meter, err := cost.New()
	if err != nil {
		t.Fatal(err)
	}
	alloc, _ := allocate.New(pol)
	leased := quota.NewLeased(clk, pol)
	b.reg.MustRegister(b.prom.Quota(enf, leased), b.prom.QuotaReplica(replica{alloc}), triageprom.SlowSenders(slow(7)))
	for _, reg := range []func() error{
		func() error { _, err := b.otel.Quota(enf, leased); return err },
		func() error { _, err := b.otel.QuotaReplica(replica{alloc}); return err },
		func() error { _, err := b.otel.SlowSenders(slow(7)); return err },
	} {
		if err := reg(); err != nil {
			t.Fatal(err)
		}
	}
	loop := trust.MustNew(trust.Config{Networks: []string{"127.0.0.1/32", "::1/128"}})
	sh := shadow.Tee(b.prom.Shadow(), b.otel.Shadow())

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cln, err := connload.NewListener(ln)
	if err != nil {
		t.Fatal(err)
	}
	b.reg.MustRegister(triageprom.ConnLoadState(cln))
	if _, err := b.otel.ConnLoad(cln); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	hold := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("hold") != "" {
				<-release
			}
			h.ServeHTTP(w, r)
		})
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	mw, err := triagehttp.Middleware(triagehttp.WithAdmission(ctl), triagehttp.WithIntake(intake.WithClassifier(cl), intake.WithTrust(loop),
		intake.WithQuota(enf, meter)))
	if err != nil {
		t.Fatal(err)
	}
	shadowCtl, err := admission.New(admission.WithLimits(1, 1, 1), admission.WithQueueFactor(0))
	if err != nil {
		t.Fatal(err)
	}
	shadowMW, err := triagehttp.Middleware(triagehttp.WithAdmission(shadowCtl), triagehttp.WithIntake(intake.WithShadow(shadow.Of(shadow.Admission), sh)))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/shadow/", shadowMW(hold(ok)))
	mux.Handle("/", mw(hold(ok)))
	srv := httptest.NewUnstartedServer(mux)
	srv.Listener = cln
	srv.Start()
	defer srv.Close()

	policy, err := retry.New(retry.WithObserver(retry.Tee(b.prom.Client("backend"), b.otel.Client("backend"))),
		retry.WithBackoff(time.Millisecond, 2*time.Millisecond), retry.WithShadow(shadow.Of(shadow.RetryBudget), sh))
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string, l criticality.Level, header http.Header) error {
		ctx := criticality.NewContext(context.Background(), l)
		return policy.Do(ctx, func(ctx context.Context) error {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+path, nil)
			for k, v := range header {
				req.Header[k] = v
			}
			req.Header.Set("Triage-Criticality", criticality.Of(ctx).String())
			resp, err := srv.Client().Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if oe, ok := triagehttp.FromResponse(resp); ok {
				return oe
			}
			return nil
		})
	}
	// Two requests hold the only slots (of the server and of the shadow
	// server); the others are refused (or, in shadow, let through) while
	// they do.
	var wg sync.WaitGroup
	for _, p := range []string{"/a?hold=1", "/shadow/a?hold=1"} {
		wg.Add(1)
		go func() { defer wg.Done(); _ = get(p, criticality.Critical, nil) }()
	}
	for ctl.Stats().Executing < 1 || shadowCtl.Stats().Executing < 1 {
		runtime.Gosched()
	}
	var refused int
	for i := range 40 {
		l := criticality.All()[i%criticality.NumLevels]
		path := []string{"/x", "/batch/y", "/shadow/z"}[i%3]
		h := http.Header{}
		if i%5 == 0 {
			h.Set("Triage-Customer", "ads")
		}
		if err := get(path, l, h); outcome.Classify(err).Overload() {
			refused++
		}
	}
	close(release)
	wg.Wait()
	for range 5 { // after the holders: admitted, and "ads" over its quota
		_ = get("/q", criticality.CriticalPlus, http.Header{"Triage-Customer": {"ads"}})
	}
	// An untrusted request's triage keys are stripped: from a client
	// that is not loopback-trusted. Loopback is trusted here, so strip
	// a folded key instead (dropped from any peer).
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/x", nil)
	req.Header["Triage_criticality"] = []string{"CRITICAL"}
	if resp, err := srv.Client().Do(req); err == nil {
		resp.Body.Close()
	}
	if refused == 0 {
		t.Fatal("no request was refused: the load did not exercise rejections")
	}

	// A balancer with two endpoints, one state change, picks.
	tr, err := b.otel.Balancers()
	if err != nil {
		t.Fatal(err)
	}
	pb := b.prom.Balancers()
	b.reg.MustRegister(pb)
	bt := tracker{p: pb, o: tr}
	bal, err := balance.New(balance.WithObserver(bt.Observer("backend")))
	if err != nil {
		t.Fatal(err)
	}
	pb.Add("backend", bal)
	tr.Add("backend", bal)
	eps, _ := bal.SetEndpoints([]string{"10.0.0.1:80", "10.0.0.2:80"})
	for _, e := range eps {
		e.SetState(balance.Healthy)
	}
	eps[1].SetState(balance.LameDuck)
	for range 9 {
		if e, err := bal.Pick(); err == nil {
			e.Done(false)
		}
	}
	// The quota service hands out a lease.
	ls, err := alloc.Refresh(quota.Report{Task: "t1", Customers: table.Snapshot()})
	if err != nil {
		t.Fatal(err)
	}
	leased.Set(ls)

	// Connections close as their clients let them go: both read the
	// listener once none is open.
	srv.Client().CloseIdleConnections()
	for end := time.Now().Add(10 * time.Second); cln.Stats().Open > 0 && time.Now().Before(end); {
		runtime.Gosched()
	}
	promSeries := gatherProm(t, b.reg)
	otelPoints := collectOTel(t, b.reader)
	rows := compare(t, promSeries, otelPoints)
	seen := map[string]bool{}
	for _, r := range rows {
		seen[r.prom[:strings.IndexAny(r.prom+"{", "{")]] = true
	}
	for p := range triageotel.Names() {
		if !seen[p] {
			t.Errorf("%s: no series in this load: the parity test does not cover it", p)
		}
	}
	sameSeries(t, promSeries, exportedSeries(t, b.exported))
	if path := os.Getenv("TRIAGE_PARITY_TABLE"); path != "" {
		writeTable(t, path, rows)
	}
}

// exportedSeries returns every sample OpenTelemetry's Prometheus exporter
// gives, as gatherProm does, without what the exporter adds to every
// series (target_info, the otel_scope_* labels).
func exportedSeries(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		ls := mf.Metric[:0]
		for _, m := range mf.Metric {
			m.Label = slices.DeleteFunc(m.Label, func(l *dto.LabelPair) bool { return strings.HasPrefix(l.GetName(), "otel_scope_") })
			ls = append(ls, m)
		}
		mf.Metric = ls
	}
	mfs = slices.DeleteFunc(mfs, func(mf *dto.MetricFamily) bool { return mf.GetName() == "target_info" })
	return samples(mfs)
}

// sameSeries requires the exporter's series to be triageprom's, name and
// labels, with the same values (within 10% for those that move): one
// dashboard, rule file and HPA serve a user of either.
func sameSeries(t *testing.T, prom, exported map[string]float64) {
	t.Helper()
	for key, pv := range prom {
		ev, ok := exported[key]
		switch {
		case !ok:
			t.Errorf("%s: not among the OpenTelemetry exporter's series", key)
		case pv != ev && !(math.IsInf(pv, 1) && math.IsInf(ev, 1)) && math.Abs(pv-ev) > 0.1*math.Max(math.Abs(pv), math.Abs(ev))+0.05:
			t.Errorf("%s = %v, the OpenTelemetry exporter's = %v", key, pv, ev)
		}
	}
	for key := range exported {
		if _, ok := prom[key]; !ok {
			t.Errorf("%s: the OpenTelemetry exporter's series is not triageprom's", key)
		}
	}
}

type row struct {
	prom, otel string
	pv, ov     float64
}

// gatherProm returns every sample: "name{label=value,...}" -> value;
// a histogram gives its count (name_count) and sum (name_sum).
func gatherProm(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return samples(mfs)
}

// samples returns "name{label=value,...}" -> value for every sample of
// mfs; a histogram gives its count.
func samples(mfs []*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			key := mf.GetName() + labels(m.Label)
			switch {
			case m.Counter != nil:
				out[key] = m.Counter.GetValue()
			case m.Gauge != nil:
				out[key] = m.Gauge.GetValue()
			case m.Histogram != nil:
				out[key] = float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return out
}

func labels(ls []*dto.LabelPair) string {
	if len(ls) == 0 {
		return ""
	}
	kv := make([]string, 0, len(ls))
	for _, l := range ls {
		kv = append(kv, l.GetName()+"="+l.GetValue())
	}
	sort.Strings(kv)
	return "{" + strings.Join(kv, ",") + "}"
}

func attrs(s attribute.Set) string {
	if s.Len() == 0 {
		return ""
	}
	kv := make([]string, 0, s.Len())
	for _, a := range s.ToSlice() {
		kv = append(kv, string(a.Key)+"="+a.Value.Emit())
	}
	sort.Strings(kv)
	return "{" + strings.Join(kv, ",") + "}"
}

// collectOTel returns every data point: "name{attr=value,...}" -> value.
func collectOTel(t *testing.T, r *sdkmetric.ManualReader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[m.Name+attrs(p.Attributes)] = float64(p.Value)
				}
			case metricdata.Sum[float64]:
				for _, p := range d.DataPoints {
					out[m.Name+attrs(p.Attributes)] = p.Value
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[m.Name+attrs(p.Attributes)] = float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					out[m.Name+attrs(p.Attributes)] = p.Value
				}
			case metricdata.Histogram[float64]: // compared by count
				for _, p := range d.DataPoints {
					out[m.Name+attrs(p.Attributes)] = float64(p.Count)
				}
			default:
				t.Errorf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return out
}

// compare matches every Prometheus sample with its data point and back.
// Values read at collection that move with time (rates, ages, the mean
// service time) are compared within 10%; everything else exactly.
func compare(t *testing.T, prom, otel map[string]float64) []row {
	t.Helper()
	moving := map[string]bool{"triage_quota_lease_age_seconds": true, "triage_admission_service_seconds": true, "triage_quota_task_refresh_age_max_seconds": true,
		"triage_quota_usage_cpu": true, "triage_quota_demand_cpu": true, "triage_quota_global_usage_cpu": true, "triage_quota_global_demand_cpu": true}
	names := triageotel.Names()
	var rows []row
	matched := map[string]bool{}
	for key, pv := range prom {
		name, lbl, _ := strings.Cut(key, "{")
		if lbl != "" {
			lbl = "{" + lbl
		}
		on, ok := names[name]
		if !ok {
			t.Errorf("%s: a Prometheus series with no OpenTelemetry name", key)
			continue
		}
		okey := on + lbl
		ov, ok := otel[okey]
		if !ok {
			t.Errorf("%s: no data point %s", key, okey)
			continue
		}
		matched[okey] = true
		rows = append(rows, row{prom: key, otel: okey, pv: pv, ov: ov})
		switch {
		case moving[name]:
			if math.Abs(pv-ov) > 0.1*math.Max(math.Abs(pv), math.Abs(ov))+0.05 {
				t.Errorf("%s = %v, %s = %v", key, pv, okey, ov)
			}
		case pv != ov && !(math.IsInf(pv, 1) && math.IsInf(ov, 1)):
			t.Errorf("%s = %v, %s = %v", key, pv, okey, ov)
		}
	}
	for okey := range otel {
		if !matched[okey] {
			t.Errorf("%s: a data point with no Prometheus series", okey)
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].prom < rows[j].prom })
	return rows
}

func writeTable(t *testing.T, path string, rows []row) {
	var sb strings.Builder
	sb.WriteString("| Prometheus series | Prometheus | OpenTelemetry data point | OpenTelemetry |\n|---|---|---|---|\n")
	for _, r := range rows {
		if r.pv == 0 && r.ov == 0 {
			continue
		}
		fmt.Fprintf(&sb, "| `%s` | %g | `%s` | %g |\n", r.prom, r.pv, r.otel, r.ov)
	}
	fmt.Fprintf(&sb, "\n%d series compared, %d of them zero (not listed).\n", len(rows), countZero(rows))
	if err := os.WriteFile(path, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

func countZero(rows []row) int {
	n := 0
	for _, r := range rows {
		if r.pv == 0 && r.ov == 0 {
			n++
		}
	}
	return n
}

// Without WithCustomers neither adapter names a customer, and the
// exporter's series are still triageprom's: usage and demand summed.
func TestParityWithoutCustomers(t *testing.T) {
	b := newBoth(t, false)
	pol, _ := quota.New(quota.Config{Customers: map[string]quota.Limit{"ads": {CPU: 1}, "search": {CPU: 1}}})
	table, _ := usage.New()
	table.Add("ads", criticality.Sheddable, time.Second)
	table.Add("search", criticality.Critical, time.Second)
	enf, _ := quota.NewEnforcer(pol, table)
	alloc, _ := allocate.New(pol)
	if _, err := alloc.Refresh(quota.Report{Task: "t1", Customers: table.Snapshot()}); err != nil {
		t.Fatal(err)
	}
	b.reg.MustRegister(b.prom.Quota(enf, nil), b.prom.QuotaService(alloc))
	if _, err := b.otel.Quota(enf, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.otel.QuotaService(alloc); err != nil {
		t.Fatal(err)
	}
	prom := gatherProm(t, b.reg)
	for key := range prom {
		if strings.Contains(key, "customer=") {
			t.Errorf("%s names a customer", key)
		}
	}
	if prom["triage_quota_global_usage_cpu{criticality=CRITICAL}"] == 0 {
		t.Errorf("no global usage summed: %v", prom)
	}
	sameSeries(t, prom, exportedSeries(t, b.exported))
}
