package report

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"os"
	"path/filepath"

	"github.com/triagehq/triage/loadtest"
	"github.com/triagehq/triage/sim"
)

// LoadtestPlots draws r: goodput by criticality against the load (with
// the provisioned ideal), latency percentiles against the load, calls by
// outcome per step, and successes per second over the whole run.
func LoadtestPlots(r *loadtest.Result) []sim.Plot {
	good := sim.Plot{Name: "goodput", Title: "Goodput against offered load (1 = the capacity C)", XLabel: "offered load (x C)", YLabel: "successes / C"}
	ideal := sim.Series{Name: "provisioned: min(load, 1)"}
	total := sim.Series{Name: "all"}
	levels := make([]sim.Series, len(r.Mix))
	for i, sh := range r.Mix {
		levels[i].Name = sh.Level.String()
	}
	lat := sim.Plot{Name: "latency", Title: "Latency of the successes", XLabel: "offered load (x C)", YLabel: "ms from scheduled send"}
	p50, p90, p99 := sim.Series{Name: "p50"}, sim.Series{Name: "p90"}, sim.Series{Name: "p99"}
	outc := sim.Plot{Name: "outcomes", Title: "Calls by outcome (share of the step's calls)", YLabel: "share"}
	outs := make([]sim.Series, loadtest.NumOutcomes)
	for o := range outs {
		outs[o].Name = loadtest.Outcome(o).String()
	}
	timeline := sim.Plot{Name: "timeline", Title: "Successes per second over the run (steps alternately shaded)", XLabel: "seconds since the first step", YLabel: "successes / s"}
	tlLevels := make([]sim.Series, len(r.Mix))
	for i, sh := range r.Mix {
		tlLevels[i].Name = sh.Level.String()
	}
	offset := 0.0
	for k, st := range r.Steps {
		x := st.Load
		ideal.X, ideal.Y = append(ideal.X, x), append(ideal.Y, min(x, 1))
		total.X, total.Y = append(total.X, x), append(total.Y, st.Goodput)
		for i, lr := range st.Levels {
			levels[i].X, levels[i].Y = append(levels[i].X, x), append(levels[i].Y, lr.Goodput)
		}
		p50.X, p50.Y = append(p50.X, x), append(p50.Y, st.Latency.P50)
		p90.X, p90.Y = append(p90.X, x), append(p90.Y, st.Latency.P90)
		p99.X, p99.Y = append(p99.X, x), append(p99.Y, st.Latency.P99)
		outc.Categories = append(outc.Categories, fmt.Sprintf("%gx", st.Load))
		for o, n := range st.Outcomes {
			share := 0.0
			if st.Scheduled > 0 {
				share = float64(n) / float64(st.Scheduled)
			}
			outs[o].Y = append(outs[o].Y, share)
		}
		for _, sec := range st.Timeline {
			for i, sh := range r.Mix {
				tlLevels[i].X = append(tlLevels[i].X, offset+sec.At)
				tlLevels[i].Y = append(tlLevels[i].Y, sec.OK[sh.Level])
			}
		}
		if k%2 == 1 {
			timeline.Shade = append(timeline.Shade, [2]float64{offset, offset + st.Seconds})
		}
		offset += st.Seconds
	}
	good.Series = append([]sim.Series{ideal, total}, levels...)
	lat.Series = []sim.Series{p50, p90, p99}
	for _, s := range outs {
		outc.Series = append(outc.Series, s)
	}
	timeline.Series = tlLevels
	plots := []sim.Plot{good, lat, outc}
	if len(tlLevels) > 0 && len(tlLevels[0].X) > 1 {
		plots = append(plots, timeline)
	}
	return plots
}

// WriteLoadtest writes r to dir (created if missing): result.json, one SVG
// per figure, and index.html, a page with the table, the capacity probe
// and the figures inline, viewable with no network. It returns the files
// written.
func WriteLoadtest(dir string, r *loadtest.Result) ([]string, error) {
	if r == nil || len(r.Steps) == 0 {
		return nil, errors.New("report: no load test result")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	var written []string
	write := func(name string, data []byte) error {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return fmt.Errorf("report: %w", err)
		}
		written = append(written, path)
		return nil
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	if err := write("result.json", append(js, '\n')); err != nil {
		return nil, err
	}
	page := loadtestPage{Result: r, Table: r.Table()}
	for _, p := range LoadtestPlots(r) {
		svg, err := SVG(p)
		if err != nil {
			return nil, err
		}
		if err := write(p.Name+".svg", svg); err != nil {
			return nil, err
		}
		page.Figures = append(page.Figures, figure{Title: p.Title, SVG: template.HTML(inlineSVG(svg))})
	}
	var html bytes.Buffer
	if err := loadtestTemplate.Execute(&html, page); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	if err := write("index.html", html.Bytes()); err != nil {
		return nil, err
	}
	return written, nil
}

type loadtestPage struct {
	Result  *loadtest.Result
	Table   [][]string
	Figures []figure
}

var loadtestTemplate = template.Must(template.New("loadtest").Funcs(template.FuncMap{
	"f0":  func(v float64) string { return fmt.Sprintf("%.0f", v) },
	"f1":  func(v float64) string { return fmt.Sprintf("%.1f", v) },
	"pct": func(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) },
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>triage loadtest{{with .Result.Target}} {{.}}{{end}}</title>
<style>
body { font: 15px/1.45 system-ui, sans-serif; max-width: 1400px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 13px; }
.wide { overflow-x: auto; }
th, td { border-bottom: 1px solid #ddd; padding: .3em .6em; text-align: left; }
td { font-variant-numeric: tabular-nums; }
figure { margin: 1.5em 0; }
figure svg { max-width: 100%; height: auto; }
.note { color: #666; font-size: 90%; }
</style></head><body>
<h1>triage loadtest</h1>
<p>Target: <code>{{.Result.Target}}</code>. Capacity C = <b>{{f0 .Result.Capacity}} calls/s</b>{{if .Result.CapacityProbed}}, probed with closed-loop callers{{else}}, as given{{end}}.
Deadline {{f0 .Result.DeadlineMS}} ms. Mix: {{range $i, $s := .Result.Mix}}{{if $i}}, {{end}}{{$s.Level}} {{$s.Weight}}{{end}}.</p>
<p class="note">Each step offers load x C calls per second on an open loop (calls are sent on schedule whatever happened to earlier ones). Goodput is successes per second over C; a service that keeps its provisioned rate stays near min(load, 1), its critical traffic first. Per criticality: goodput (and the share of that criticality's calls that succeeded).</p>
<h2>Steps</h2>
<div class="wide"><table>{{range $i, $row := .Table}}<tr>{{range $row}}{{if eq $i 0}}<th>{{.}}</th>{{else}}<td>{{.}}</td>{{end}}{{end}}</tr>
{{end}}</table></div>
{{range .Figures}}<figure aria-label="{{.Title}}">{{.SVG}}</figure>
{{end}}
{{with .Result.Probe}}<h2>Capacity probe</h2>
<table><tr><th>callers</th><th>successes/s</th><th>p50 ms</th><th>failed</th></tr>
{{range .}}<tr><td>{{.Workers}}</td><td>{{f0 .OKPerSecond}}</td><td>{{f1 .P50MS}}</td><td>{{pct .FailedFraction}}</td></tr>
{{end}}</table>{{end}}
</body></html>
`))
