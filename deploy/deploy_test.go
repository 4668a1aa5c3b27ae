package deploy_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const (
	rulesFile     = "prometheus/triage-rules.yml"
	rulesTestFile = "prometheus/triage-rules.test.yml"
	dashboardFile = "grafana/triage-dashboard.json"
)

// promtool returns the promtool binary; without one the test skips,
// except in CI (CI=true), which installs it.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not found; .ci/run installs Debian's prometheus package")
		}
		t.Skip("promtool not found (apt-get install prometheus)")
	}
	return p
}

func run(t *testing.T, dir string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
}

// The rules pass promtool's check, and its unit tests: each alert fires on
// recorded series and stays quiet otherwise.
func TestPrometheusRules(t *testing.T) {
	p := promtool(t)
	run(t, ".", p, "check", "rules", rulesFile)
	run(t, "prometheus", p, "test", "rules", filepath.Base(rulesTestFile))
}

var seriesName = regexp.MustCompile(`\btriage(_[a-z0-9_]+|:[a-z0-9_:]+)`)

// exported returns the metric names triageprom exports, read from its
// source.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob("../triageprom/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("triageprom sources: %v", err)
	}
	names := map[string]bool{}
	def := regexp.MustCompile(`"(triage_[a-z0-9_]+)"`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range def.FindAllSubmatch(b, -1) {
			names[string(m[1])] = true
		}
	}
	return names
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record string `yaml:"record"`
			Alert  string `yaml:"alert"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.Unmarshal(b, &rf); err != nil {
		t.Fatal(err)
	}
	return rf
}

// known is every series the rules and dashboard may read: triageprom's
// metrics and the rules' records.
func known(t *testing.T) map[string]bool {
	names := exported(t)
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				names[r.Record] = true
			}
		}
	}
	return names
}

func checkSeries(t *testing.T, where, expr string, names map[string]bool) {
	t.Helper()
	for _, m := range seriesName.FindAllString(expr, -1) {
		if strings.HasPrefix(m, "triage:") && strings.Contains(expr, `"`+m) {
			continue // inside a __name__ regexp, checked by the recorded names it matches
		}
		if !names[m] {
			t.Errorf("%s reads %s, which triageprom does not export and no rule records", where, m)
		}
	}
}

// Every series a rule reads exists.
func TestRulesReadExportedSeries(t *testing.T) {
	names := known(t)
	n := 0
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			checkSeries(t, "rule "+r.Record+r.Alert, r.Expr, names)
			n++
		}
	}
	if n < 8 {
		t.Fatalf("only %d rules", n)
	}
	// The checker itself: a misspelt series is caught.
	if names["triage_admission_rejected"] || !names["triage_admission_rejected_total"] {
		t.Fatal("the exported names were not read right")
	}
}

// dashboard is the part of Grafana's dashboard model (schemaVersion 39)
// that this dashboard uses; decoding refuses any other field.
type dashboard struct {
	UID           string                    `json:"uid"`
	Title         string                    `json:"title"`
	Description   string                    `json:"description"`
	Tags          []string                  `json:"tags"`
	Timezone      string                    `json:"timezone"`
	Editable      bool                      `json:"editable"`
	GraphTooltip  int                       `json:"graphTooltip"`
	SchemaVersion int                       `json:"schemaVersion"`
	Version       int                       `json:"version"`
	Time          struct{ From, To string } `json:"time"`
	Refresh       string                    `json:"refresh"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Label      string          `json:"label"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *datasource     `json:"datasource"`
			Definition string          `json:"definition"`
			IncludeAll bool            `json:"includeAll"`
			Multi      bool            `json:"multi"`
			AllValue   string          `json:"allValue"`
			Current    map[string]any  `json:"current"`
			Refresh    int             `json:"refresh"`
			Hide       int             `json:"hide"`
		} `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []any `json:"list"`
	} `json:"annotations"`
	Links  []any   `json:"links"`
	Panels []panel `json:"panels"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID          int         `json:"id"`
	Type        string      `json:"type"`
	Title       string      `json:"title"`
	Description string      `json:"description"`
	Datasource  *datasource `json:"datasource"`
	GridPos     struct {
		H, W, X, Y int
	} `json:"gridPos"`
	FieldConfig struct {
		Defaults struct {
			Unit   string         `json:"unit"`
			Min    *float64       `json:"min"`
			Max    *float64       `json:"max"`
			Custom map[string]any `json:"custom"`
		} `json:"defaults"`
		Overrides []any `json:"overrides"`
	} `json:"fieldConfig"`
	Options map[string]any `json:"options"`
	Targets []struct {
		RefID        string      `json:"refId"`
		Datasource   *datasource `json:"datasource"`
		Expr         string      `json:"expr"`
		LegendFormat string      `json:"legendFormat"`
	} `json:"targets"`
}

// The dashboard decodes strictly into Grafana's model, is laid out on
// the 24-column grid without overlaps, reads only series that exist, and
// each query parses (promtool checks them as recording rules).
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var d dashboard
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("dashboard does not fit the model: %v", err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 || len(d.Panels) < 6 {
		t.Fatalf("uid %q, title %q, schemaVersion %d, %d panels", d.UID, d.Title, d.SchemaVersion, len(d.Panels))
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	if !vars["datasource"] || !vars["job"] {
		t.Fatalf("variables %v, want datasource and job", vars)
	}
	names := known(t)
	var grid [64][24]int // panel id per cell
	ids := map[int]bool{}
	var exprs []string
	for _, p := range d.Panels {
		if ids[p.ID] || p.ID <= 0 {
			t.Errorf("panel %q: id %d repeated or not positive", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Type != "timeseries" && p.Type != "stat" && p.Type != "table" {
			t.Errorf("panel %q: type %q", p.Title, p.Type)
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v", p.Title, p.Datasource)
		}
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 || g.Y+g.H > len(grid) {
			t.Errorf("panel %q: gridPos %+v off the grid", p.Title, g)
			continue
		}
		for y := g.Y; y < g.Y+g.H; y++ {
			for x := g.X; x < g.X+g.W; x++ {
				if grid[y][x] != 0 {
					t.Errorf("panel %q overlaps panel %d", p.Title, grid[y][x])
				}
				grid[y][x] = p.ID
			}
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			if q.RefID == "" || refs[q.RefID] || strings.TrimSpace(q.Expr) == "" {
				t.Errorf("panel %q: query %+v", p.Title, q)
			}
			refs[q.RefID] = true
			checkSeries(t, "panel "+p.Title, q.Expr, names)
			exprs = append(exprs, q.Expr)
		}
	}
	// Each query parses: promtool checks them as recording rules, with the
	// dashboard's variables replaced by values.
	p := promtool(t)
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range exprs {
		e = strings.ReplaceAll(e, "$job", "backend")
		q, _ := json.Marshal(e)
		rules.WriteString("      - record: dashboard:query" + string(rune('a'+i)) + "\n        expr: " + string(q) + "\n")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard-rules.yml"), []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, dir, p, "check", "rules", "dashboard-rules.yml")
}
