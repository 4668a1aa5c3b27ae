package drill

import (
	"bytes"
	"fmt"
	"html/template"
	"net"
	"sort"
	"strings"

	"github.com/triagehq/triage/cmd/triage/internal/report"
	"github.com/triagehq/triage/criticality"
	"github.com/triagehq/triage/sim"
)

func listen(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }

// figure is one drawn plot.
type figure struct {
	Title string
	SVG   template.HTML
}

// plots returns the run's figures, as data.
func (r *RunResult) plots(slug string) []sim.Plot {
	var xs []float64
	for i := range r.Seconds {
		xs = append(xs, float64(i)+0.5)
	}
	var out []sim.Plot
	for _, p := range []sim.Plot{r.goodputPlot(slug, xs), r.latencyPlot(slug, xs), r.latencyByCriticalityPlot(slug, xs), r.timeByTierPlot(slug, xs), r.rejectionsPlot(slug, xs), r.utilPlot(slug, xs), r.usagePlot(slug, xs)} {
		if len(p.Series) > 0 {
			out = append(out, p)
		}
	}
	return out
}

// series is the values f gives for each second that has one, at xs.
func (r *RunResult) series(name string, xs []float64, f func(s *Second) (float64, bool)) sim.Series {
	se := sim.Series{Name: name}
	for i := range r.Seconds {
		if v, ok := f(&r.Seconds[i]); ok {
			se.X, se.Y = append(se.X, xs[i]), append(se.Y, v)
		}
	}
	return se
}

func (r *RunResult) goodputPlot(slug string, xs []float64) sim.Plot {
	p := sim.Plot{Name: "goodput-" + slug, Title: r.Name + ": answered per second, by criticality", XLabel: "time (s)", YLabel: "requests/s"}
	for l := criticality.NumLevels - 1; l >= 0; l-- {
		p.Series = append(p.Series, r.series(criticality.Level(l).String(), xs, func(s *Second) (float64, bool) { return float64(s.OK[l]), true }))
	}
	p.Series = append(p.Series, r.series("provisioned rate", xs, func(*Second) (float64, bool) { return ProvisionedRate, true }))
	if w := r.FaultWindow; w[1] > w[0] {
		p.Title = r.Name + ": answered per second, by criticality (shaded: the fault)"
		p.Shade = [][2]float64{w}
	}
	return p
}

func (r *RunResult) latencyPlot(slug string, xs []float64) sim.Plot {
	p := sim.Plot{Name: "latency-" + slug, Title: r.Name + ": latency of successful requests", XLabel: "time (s)", YLabel: "ms"}
	p50 := r.series("p50", xs, func(s *Second) (float64, bool) { return s.P50, s.P99 > 0 })
	p99 := r.series("p99", xs, func(s *Second) (float64, bool) { return s.P99, s.P99 > 0 })
	if len(p50.X) > 0 {
		p.Series = []sim.Series{p50, p99}
	}
	return p
}

// latencyByCriticalityPlot is each criticality's p99 per second: whether
// CRITICAL pays for the sheddable work admitted beside it.
func (r *RunResult) latencyByCriticalityPlot(slug string, xs []float64) sim.Plot {
	p := sim.Plot{Name: "latency-criticality-" + slug, Title: r.Name + ": p99 latency of successful requests, by criticality", XLabel: "time (s)", YLabel: "ms"}
	for l := criticality.NumLevels - 1; l >= 0; l-- {
		name := criticality.Level(l).String()
		se := r.series(name, xs, func(s *Second) (float64, bool) {
			lat, ok := s.Latency[name]
			return lat.P99, ok
		})
		if len(se.X) > 0 {
			p.Series = append(p.Series, se)
		}
	}
	return p
}

// timeByTierPlot is where CRITICAL requests spent their time per second:
// each tier's own time (its queue, machine slot, service and backoffs),
// and the rest of the frontend's call, between the tiers (the transport,
// and each process waiting for the host's CPU).
func (r *RunResult) timeByTierPlot(slug string, xs []float64) sim.Plot {
	p := sim.Plot{Name: "time-by-tier-" + slug, Title: r.Name + ": where CRITICAL's time went, mean per request", XLabel: "time (s)", YLabel: "ms"}
	own := func(b Breakdown) float64 { return b.Queue + b.Slot + b.Service + b.Backoff }
	at := func(s *Second, role string) (Breakdown, bool) {
		b, ok := s.TimeByTier[role]["CRITICAL"]
		if !ok {
			b, ok = s.TimeByTier[role][Unlabelled]
		}
		return b, ok
	}
	for _, role := range []string{RoleDB, RoleB, RoleA, RoleFrontend} {
		se := r.series(role, xs, func(s *Second) (float64, bool) {
			b, ok := at(s, role)
			return own(b), ok
		})
		if len(se.X) > 0 {
			p.Series = append(p.Series, se)
		}
	}
	between := r.series("between the tiers", xs, func(s *Second) (float64, bool) {
		f, ok := at(s, RoleFrontend)
		if !ok {
			return 0, false
		}
		rest := f.Downstream
		for _, role := range []string{RoleA, RoleB, RoleDB} {
			b, _ := at(s, role)
			rest -= own(b)
		}
		return max(rest, 0), true
	})
	if len(between.X) > 0 {
		p.Series = append(p.Series, between)
	}
	return p
}

func (r *RunResult) rejectionsPlot(slug string, xs []float64) sim.Plot {
	p := sim.Plot{Name: "rejections-" + slug, Title: r.Name + ": failed requests per second, by reason", XLabel: "time (s)", YLabel: "requests/s"}
	reasons := map[string]int{}
	for _, s := range r.Seconds {
		for k, v := range s.Rejected {
			reasons[k] += v
		}
	}
	for _, k := range sortedKeys(reasons) {
		p.Series = append(p.Series, r.series(k, xs, func(s *Second) (float64, bool) { return float64(s.Rejected[k]), true }))
	}
	return p
}

func (r *RunResult) utilPlot(slug string, xs []float64) sim.Plot {
	p := sim.Plot{Name: "util-" + slug, Title: r.Name + ": utilization per task (busy share of its slots)", XLabel: "time (s)", YLabel: "utilization"}
	var tasks []string
	for _, t := range r.tasks {
		if !strings.HasPrefix(t, RoleFrontend) {
			tasks = append(tasks, t)
		}
	}
	sort.Strings(tasks)
	for _, t := range tasks {
		if se := r.series(t, xs, func(s *Second) (float64, bool) { v, ok := s.Util[t]; return v, ok }); len(se.X) > 0 {
			p.Series = append(p.Series, se)
		}
	}
	return p
}

func (r *RunResult) usagePlot(slug string, xs []float64) sim.Plot {
	p := sim.Plot{Name: "usage-" + slug, Title: r.Name + ": DB usage per customer against its quota", XLabel: "time (s)", YLabel: "slot-seconds per second"}
	customers := map[string]bool{}
	for _, s := range r.Seconds {
		for c := range s.Usage {
			if c != "" && !strings.HasPrefix(c, "(") {
				customers[c] = true
			}
		}
	}
	for _, c := range sortedKeys(customers) {
		p.Series = append(p.Series, r.series(c+" usage", xs, func(s *Second) (float64, bool) { return s.Usage[c], s.Usage != nil }))
	}
	for _, c := range []string{"abuser", "gmail"} {
		if se := r.series(c+" quota", xs, func(s *Second) (float64, bool) { v, ok := s.Limit[c]; return v, ok }); len(se.X) > 0 {
			p.Series = append(p.Series, se)
		}
	}
	return p
}

// Report renders report.html: self-contained, every figure inline.
func (res *Result) Report() ([]byte, error) {
	type runView struct {
		Name    string
		Figures []figure
		Missing []string
		Notes   []string
		Deaths  []string
	}
	data := struct {
		Summary     string
		Runs        []runView
		Attempts    template.HTML
		Provisioned float64
		Faults      bool
		Shadow      []ShadowRow
	}{Summary: res.Summary(), Provisioned: ProvisionedRate, Faults: len(res.Faults) > 0, Shadow: res.ShadowRows}
	att := sim.Plot{Name: "attempts", Title: "attempts received by the DB tier (Figure 21-1)", YLabel: "requests",
		Categories: []string{"first attempt", "1st retry", "2nd retry", "3rd retry"}}
	for i, r := range res.Runs {
		rv := runView{Name: r.Name, Notes: r.Notes, Deaths: r.Deaths}
		for _, p := range r.plots(fmt.Sprint("run", i)) {
			svg, err := report.SVG(p)
			if err != nil {
				return nil, err
			}
			rv.Figures = append(rv.Figures, figure{Title: p.Title, SVG: template.HTML(svg)})
		}
		if !r.Protection {
			rv.Missing = append(rv.Missing, "no quota service in this run: the DB's usage per customer is not measured")
		}
		data.Runs = append(data.Runs, rv)
		se := sim.Series{Name: r.Name}
		for _, v := range r.Attempts {
			se.Y = append(se.Y, float64(v))
		}
		att.Series = append(att.Series, se)
	}
	if len(att.Series) > 0 {
		svg, err := report.SVG(att)
		if err != nil {
			return nil, err
		}
		data.Attempts = template.HTML(svg)
	}
	var buf bytes.Buffer
	if err := reportPage.Execute(&buf, data); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

var reportPage = template.Must(template.New("report").Parse(`<!doctype html>
<html lang="en"><meta charset="utf-8"><title>triage overload drill</title>
<style>
body{font-family:sans-serif;margin:2em;max-width:1600px}
pre{background:#f6f6f6;padding:1em;overflow-x:auto}
.runs{display:grid;grid-template-columns:1fr 1fr;gap:1em}
figure{margin:0 0 1em 0} svg{width:100%;height:auto}
table{border-collapse:collapse;margin:1em 0} td,th{border:1px solid #ccc;padding:.2em .6em} td.n{text-align:right}
</style>
{{if .Faults}}<h1>triage fault harness</h1>
<p>The drill's stack on loopback sockets (an HTTP frontend, gRPC backends A and B, the DB frontend, three tasks per gRPC tier,
the quota service) provisioned for {{.Provisioned}} requests per second, serving that rate (or twice it, where the fault says) while
a fault is injected and removed. Each fault runs with triage's protections and without them, on the same traffic; the shaded band
of each goodput figure is the fault's window.</p>
{{else}}<h1>triage overload drill</h1>
<p>A stack on loopback sockets (an HTTP frontend, gRPC backends A and B, the DB frontend: the SRE book's Figure 21-2,
three tasks per gRPC tier on machines of two speeds) provisioned for {{.Provisioned}} requests per second, hit by ten times that
(sheddable traffic and an abusive customer; the critical traffic stays within the provisioned rate), then a rolling restart
of tier B, then a SIGKILL of the DB's biggest task, then recovery. The same traffic, with triage's protections and without them{{if .Shadow}}, and with
triage's stack in shadow mode: every refusing mechanism deciding and counting, nothing refused{{end}}.</p>{{end}}
<pre>{{.Summary}}</pre>
{{if .Shadow}}<h2>shadow mode: what triage would have refused, against what it refused</h2>
<p>The run "triage in shadow" is triage's stack with every refusing mechanism in shadow: each decides as it would,
counts what it would have refused, and refuses nothing. On the same load, side by side with the run with triage.
Under overload shadow's counts run higher for the mechanisms that decide by the load they measure, since nothing
it would have refused was shed.</p>
<table><tr><th>mechanism</th><th>reason</th><th>criticality</th><th>refused, with triage</th><th>would refuse, in shadow</th></tr>
{{range .Shadow}}<tr><td>{{.Mechanism}}</td><td>{{.Reason}}</td><td>{{.Criticality}}</td><td class="n">{{.Refused}}</td><td class="n">{{.WouldRefuse}}</td></tr>
{{end}}</table>{{end}}
<figure>{{.Attempts}}</figure>
<div class="runs">
{{range .Runs}}<div><h2>{{.Name}}</h2>
{{range .Figures}}<figure>{{.SVG}}</figure>
{{end}}{{range .Missing}}<p><em>{{.}}</em></p>
{{end}}{{if .Deaths}}<h3>task deaths</h3><ul>{{range .Deaths}}<li>{{.}}</li>{{end}}</ul>{{end}}
{{if .Notes}}<h3>script</h3><ul>{{range .Notes}}<li>{{.}}</li>{{end}}</ul>{{end}}
</div>
{{end}}</div>
</html>
`))
