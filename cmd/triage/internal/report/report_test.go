package report

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/triagehq/triage/sim"
)

func testResult() *sim.Result {
	two := 2.0
	return &sim.Result{
		Scenario: "test", Seed: 7,
		Headlines: []sim.Headline{{Name: "spread <b>", Value: 1.9, Book: &two, Note: "a & b"}, {Name: "other", Value: 3}},
		Table:     [][]string{{"a", "b"}, {"1", "<script>"}},
		Plots: []sim.Plot{
			{Name: "line", Title: "a line", XLabel: "x", YLabel: "y", Series: []sim.Series{{Name: "s", X: []float64{0, 1, 2}, Y: []float64{1, 3, 2}}}},
			{Name: "bars", Title: "bars", Categories: []string{"p", "q"}, Series: []sim.Series{{Name: "u", Y: []float64{1, 2}}, {Name: "v", Y: []float64{2, 1}}}},
		},
	}
}

// WriteSim writes the JSON, one SVG per figure (the book figure first)
// and a page that holds everything inline: no script, no link, no
// external source; text from the result is escaped.
func TestWriteSim(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	files, err := WriteSim(dir, testResult())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"result.json", "book.svg", "line.svg", "bars.svg", "index.html"}
	if len(files) != len(want) {
		t.Fatalf("wrote %v", files)
	}
	for i, f := range files {
		if filepath.Base(f) != want[i] {
			t.Fatalf("file %d is %s, want %s", i, f, want[i])
		}
	}
	page, err := os.ReadFile(filepath.Join(dir, "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	html := string(page)
	if n := strings.Count(html, "<svg"); n != 3 {
		t.Errorf("page has %d inline figures, want 3", n)
	}
	for _, bad := range []string{"<script", "<link", "src=", "<?xml", "<b>"} {
		if strings.Contains(html, bad) {
			t.Errorf("page contains %q", bad)
		}
	}
	if !strings.Contains(html, "spread &lt;b&gt;") || !strings.Contains(html, "&lt;script&gt;") {
		t.Error("result text is not escaped")
	}
	svg, _ := os.ReadFile(filepath.Join(dir, "line.svg"))
	if !strings.HasPrefix(strings.TrimSpace(string(svg)), "<?xml") || !strings.Contains(string(svg), "a line") {
		t.Error("line.svg is not a titled SVG document")
	}
}

func TestSVGRejectsBadPlots(t *testing.T) {
	for _, p := range []sim.Plot{
		{Name: "../x", Series: []sim.Series{{Name: "s", X: []float64{1}, Y: []float64{1}}}},
		{Name: "empty"},
		{Name: "ragged", Series: []sim.Series{{Name: "s", X: []float64{1, 2}, Y: []float64{1}}}},
		{Name: "cats", Categories: []string{"a", "b"}, Series: []sim.Series{{Name: "s", Y: []float64{1}}}},
	} {
		if _, err := SVG(p); err == nil {
			t.Errorf("plot %q accepted", p.Name)
		}
	}
	if _, err := WriteSim(t.TempDir(), nil); err == nil {
		t.Error("nil result accepted")
	}
}

// A shaded range is drawn behind the lines (a fault's window), and an
// empty one is an error.
func TestSVGShade(t *testing.T) {
	p := sim.Plot{Name: "shade", Title: "t", Series: []sim.Series{{Name: "s", X: []float64{0, 10}, Y: []float64{1, 1}}}}
	plain, err := SVG(p)
	if err != nil {
		t.Fatal(err)
	}
	p.Shade = [][2]float64{{2, 4}}
	shaded, err := SVG(p)
	if err != nil {
		t.Fatal(err)
	}
	const grey = "fill:#DCDCDC"
	if strings.Contains(string(plain), grey) || !strings.Contains(string(shaded), grey) {
		t.Errorf("shade drawn in the plain plot (%v) or missing from the shaded one (%v)", strings.Contains(string(plain), grey), strings.Contains(string(shaded), grey))
	}
	p.Shade = [][2]float64{{4, 4}}
	if _, err := SVG(p); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty shaded range: %v", err)
	}
}
