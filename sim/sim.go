// Package sim runs the SRE book's experiments (chapters 20 and 21) on
// virtual time with triage's own mechanisms (throttle, retry, ...): no
// mechanism is re-implemented here, only the traffic and the backends
// around them. Every scenario is seeded and reproducible, and returns a
// Result whose headlines sit next to the book's numbers. `triage sim`
// prints them.
package sim

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"
)

// Headline is one number a scenario is judged by, with the book's figure
// when the book gives one.
type Headline struct {
	Name  string   `json:"name"`
	Value float64  `json:"value"`
	Book  *float64 `json:"book"`
	// Note says where the book's number comes from, or what to compare.
	Note string `json:"note,omitempty"`
}

// Result is what a scenario returns.
type Result struct {
	Scenario  string     `json:"scenario"`
	Seed      uint64     `json:"seed"`
	Headlines []Headline `json:"headlines"`
	// Table holds the scenario's detail, one row per cell, the first row
	// being the column names.
	Table [][]string `json:"table,omitempty"`
	// Plots are the figures the scenario offers, as data: the command
	// draws them (triage sim SCENARIO --out DIR).
	Plots []Plot `json:"plots,omitempty"`
	// Elapsed is the wall time the simulation took.
	Elapsed time.Duration `json:"elapsed_ns"`
}

// Plot is one figure, as data: lines (Series' X and Y), or grouped bars
// when Categories is set (each Series has one Y per category; X unused).
type Plot struct {
	// Name is the figure's file name, without extension: [a-z0-9-].
	Name   string `json:"name"`
	Title  string `json:"title"`
	XLabel string `json:"x_label"`
	YLabel string `json:"y_label"`
	// Categories name the groups of a bar chart.
	Categories []string `json:"categories,omitempty"`
	Series     []Series `json:"series"`
	// Shade are X ranges drawn shaded behind a line plot's series (a
	// fault's window, say).
	Shade [][2]float64 `json:"shade,omitempty"`
}

// Series is one line or one set of bars.
type Series struct {
	Name string    `json:"name"`
	X    []float64 `json:"x,omitempty"`
	Y    []float64 `json:"y"`
}

// BookPlot is the figure every scenario has: each headline the book gives
// a number for, simulated next to the book's. Nil when the book gives none.
func (r *Result) BookPlot() *Plot {
	p := &Plot{Name: "book", Title: r.Scenario + ": simulated against the book", YLabel: "value",
		Series: []Series{{Name: "simulated"}, {Name: "book"}}}
	for _, h := range r.Headlines {
		if h.Book == nil {
			continue
		}
		p.Categories = append(p.Categories, h.Name)
		p.Series[0].Y = append(p.Series[0].Y, h.Value)
		p.Series[1].Y = append(p.Series[1].Y, *h.Book)
	}
	if len(p.Categories) == 0 {
		return nil
	}
	return p
}

func book(v float64) *float64 { return &v }

// Headline returns the headline called name, or false.
func (r *Result) Headline(name string) (Headline, bool) {
	for _, h := range r.Headlines {
		if h.Name == name {
			return h, true
		}
	}
	return Headline{}, false
}

// WriteText prints the headlines next to the book's numbers, then the
// detail table.
func (r *Result) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "scenario %s (seed %d, %.1f s)\n\n", r.Scenario, r.Seed, r.Elapsed.Seconds())
	fmt.Fprintln(tw, "headline\tsimulated\tbook\t")
	for _, h := range r.Headlines {
		b := "-"
		if h.Book != nil {
			b = format(*h.Book)
		}
		line := fmt.Sprintf("%s\t%s\t%s\t", h.Name, format(h.Value), b)
		if h.Note != "" {
			line += h.Note
		}
		fmt.Fprintln(tw, line)
	}
	if len(r.Table) > 0 {
		fmt.Fprintln(tw)
		for _, row := range r.Table {
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
	}
	return tw.Flush()
}

func format(v float64) string {
	switch {
	case math.IsInf(v, 0) || math.IsNaN(v):
		return fmt.Sprint(v)
	case v == math.Trunc(v) && math.Abs(v) < 1e9:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.3f", v)
}
