// Package report draws what triage measures for people: the simulator's
// results as SVG figures (gonum.org/v1/plot) and one self-contained HTML
// page that needs no network to view (the figures are inline).
package report

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"image/color"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/triagehq/triage/sim"
)

// palette colours the series, in order (Okabe-Ito, readable by most
// colour-blind people).
var palette = []color.Color{
	color.RGBA{0, 114, 178, 255}, color.RGBA{213, 94, 0, 255}, color.RGBA{0, 158, 115, 255},
	color.RGBA{204, 121, 167, 255}, color.RGBA{230, 159, 0, 255}, color.RGBA{86, 180, 233, 255},
}

var nameOK = regexp.MustCompile(`^[a-z0-9-]{1,64}$`)

// SVG draws p as an SVG document.
func SVG(p sim.Plot) ([]byte, error) {
	if !nameOK.MatchString(p.Name) {
		return nil, fmt.Errorf("report: plot name %q is not [a-z0-9-]{1,64}", p.Name)
	}
	if len(p.Series) == 0 {
		return nil, fmt.Errorf("report: plot %q has no series", p.Name)
	}
	pl := plot.New()
	pl.Title.Text = p.Title
	pl.X.Label.Text = p.XLabel
	pl.Y.Label.Text = p.YLabel
	pl.Legend.Top = true
	width := vg.Length(720)
	if len(p.Categories) > 0 {
		n := len(p.Series)
		bw := vg.Points(min(40, 400/float64(n*len(p.Categories))))
		for i, s := range p.Series {
			if len(s.Y) != len(p.Categories) {
				return nil, fmt.Errorf("report: plot %q: series %q has %d values for %d categories", p.Name, s.Name, len(s.Y), len(p.Categories))
			}
			b, err := plotter.NewBarChart(plotter.Values(s.Y), bw)
			if err != nil {
				return nil, fmt.Errorf("report: plot %q: %w", p.Name, err)
			}
			b.Color = palette[i%len(palette)]
			b.LineStyle.Width = 0
			b.Offset = vg.Length(float64(i)-float64(n-1)/2) * bw
			pl.Add(b)
			pl.Legend.Add(s.Name, b)
		}
		names := make([]string, len(p.Categories))
		for i, c := range p.Categories {
			names[i] = wrap(c, 22)
		}
		pl.NominalX(names...)
		pl.Y.Min = 0
		top := 0.0
		for _, s := range p.Series {
			for _, y := range s.Y {
				top = max(top, y)
			}
		}
		pl.Y.Max = top * 1.05
	} else {
		if err := shade(pl, p); err != nil {
			return nil, err
		}
		for i, s := range p.Series {
			if len(s.X) != len(s.Y) {
				return nil, fmt.Errorf("report: plot %q: series %q has %d x and %d y", p.Name, s.Name, len(s.X), len(s.Y))
			}
			xys := make(plotter.XYs, len(s.X))
			for k := range s.X {
				xys[k].X, xys[k].Y = s.X[k], s.Y[k]
			}
			l, err := plotter.NewLine(xys)
			if err != nil {
				return nil, fmt.Errorf("report: plot %q: %w", p.Name, err)
			}
			l.Color = palette[i%len(palette)]
			l.Width = vg.Points(1.5)
			l.Dashes = dashes(i)
			pl.Add(l)
			pl.Legend.Add(s.Name, l)
		}
		pl.Add(plotter.NewGrid())
	}
	b, err := render(pl, width, vg.Length(400))
	if err != nil {
		return nil, fmt.Errorf("report: plot %q: %w", p.Name, err)
	}
	return b, nil
}

// legendWidth is the column right of the plot that holds its legend, so
// that the legend never hides a line and the last tick label is not cut.
const legendWidth = vg.Length(210)

// render draws pl with its legend in a column of its own on its right.
func render(pl *plot.Plot, width, height vg.Length) ([]byte, error) {
	leg := pl.Legend
	pl.Legend = plot.NewLegend()
	c := vgsvg.New(width+legendWidth, height)
	dc := draw.New(c)
	pl.Draw(draw.Crop(dc, 0, -legendWidth, 0, 0))
	leg.Top, leg.Left = true, true
	leg.Padding = vg.Points(3) // between entries: no line's label touches the next
	leg.Draw(draw.Crop(dc, width+vg.Length(12), 0, 0, -vg.Length(24)))
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// shade draws p's shaded X ranges, from 0 to the series' top, behind the
// lines.
func shade(pl *plot.Plot, p sim.Plot) error {
	top := 0.0
	for _, s := range p.Series {
		for _, y := range s.Y {
			top = max(top, y)
		}
	}
	if top == 0 {
		top = 1
	}
	for _, r := range p.Shade {
		if !(r[0] < r[1]) {
			return fmt.Errorf("report: plot %q: shaded range %v is empty", p.Name, r)
		}
		poly, err := plotter.NewPolygon(plotter.XYs{{X: r[0], Y: 0}, {X: r[1], Y: 0}, {X: r[1], Y: top}, {X: r[0], Y: top}})
		if err != nil {
			return fmt.Errorf("report: plot %q: %w", p.Name, err)
		}
		poly.Color = color.RGBA{220, 220, 220, 255}
		poly.LineStyle.Width = 0
		pl.Add(poly)
	}
	return nil
}

// dashes tells series apart without colour too.
func dashes(i int) []vg.Length {
	switch i % 3 {
	case 1:
		return []vg.Length{vg.Points(6), vg.Points(3)}
	case 2:
		return []vg.Length{vg.Points(2), vg.Points(2)}
	}
	return nil
}

// wrap breaks a long category name over lines of about n characters.
func wrap(s string, n int) string {
	var b strings.Builder
	line := 0
	for i, w := range strings.Fields(s) {
		if i > 0 {
			if line+1+len(w) > n {
				b.WriteByte('\n')
				line = 0
			} else {
				b.WriteByte(' ')
				line++
			}
		}
		b.WriteString(w)
		line += len(w)
	}
	return b.String()
}

// WriteSim writes r to dir (created if missing): result.json, one SVG per
// figure (the scenario's own, and "book": the headlines against the
// book's numbers, when the book gives any), and index.html, a page with
// the headlines, the figures inline and the detail table, viewable with
// no network. It returns the files written.
func WriteSim(dir string, r *sim.Result) ([]string, error) {
	if r == nil {
		return nil, errors.New("report: no result")
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
	plots := r.Plots
	if bp := r.BookPlot(); bp != nil {
		plots = append([]sim.Plot{*bp}, plots...)
	}
	page := simPage{Result: r}
	for _, p := range plots {
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
	if err := simTemplate.Execute(&html, page); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	if err := write("index.html", html.Bytes()); err != nil {
		return nil, err
	}
	return written, nil
}

// inlineSVG drops the XML prolog so that the SVG can sit inside HTML.
func inlineSVG(svg []byte) []byte {
	if i := bytes.Index(svg, []byte("<svg")); i > 0 {
		return svg[i:]
	}
	return svg
}

type figure struct {
	Title string
	SVG   template.HTML // drawn by SVG from numbers, never from input text
}

type simPage struct {
	Result  *sim.Result
	Figures []figure
}

func bookText(h sim.Headline) string {
	if h.Book == nil {
		return "-"
	}
	return fmt.Sprintf("%.3g", *h.Book)
}

var simTemplate = template.Must(template.New("sim").Funcs(template.FuncMap{
	"book":  bookText,
	"value": func(v float64) string { return fmt.Sprintf("%.4g", v) },
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>triage sim {{.Result.Scenario}}</title>
<style>
body { font: 15px/1.45 system-ui, sans-serif; max-width: 980px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border-bottom: 1px solid #ddd; padding: .3em .7em; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1.5em 0; }
figure svg { max-width: 100%; height: auto; }
.note { color: #666; font-size: 90%; }
</style></head><body>
<h1>triage sim {{.Result.Scenario}}</h1>
<p class="note">Seed {{.Result.Seed}}. Simulated on virtual time with triage's own mechanism code (SRE book chapters 20 and 21).</p>
<h2>Headlines</h2>
<table><tr><th>headline</th><th>simulated</th><th>book</th><th></th></tr>
{{range .Result.Headlines}}<tr><td>{{.Name}}</td><td class="n">{{value .Value}}</td><td class="n">{{book .}}</td><td class="note">{{.Note}}</td></tr>
{{end}}</table>
{{range .Figures}}<figure aria-label="{{.Title}}">{{.SVG}}</figure>
{{end}}
{{with .Result.Table}}<h2>Detail</h2>
<table>{{range $i, $row := .}}<tr>{{range $row}}{{if eq $i 0}}<th>{{.}}</th>{{else}}<td>{{.}}</td>{{end}}{{end}}</tr>
{{end}}</table>{{end}}
</body></html>
`))
