package app

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/triagehq/triage/sim"
)

func TestSimSubsettingArguments(t *testing.T) {
	for _, tt := range []struct {
		args    []string
		code    int
		errText string
	}{
		{[]string{"sim"}, 2, "Usage"},
		{[]string{"sim", "queueing"}, 2, "Usage"},
		{[]string{"sim", "subsetting", "--clients", "0"}, 2, "-clients must be between 1 and 10000"},
		{[]string{"sim", "subsetting", "--backends", "10001"}, 2, "-backends must be between 1 and 10000"},
		{[]string{"sim", "subsetting", "--backends", "5", "--subset", "6"}, 2, "-subset must be between 1 and -backends"},
		{[]string{"sim", "subsetting", "--algorithm", "consistent"}, 2, "unknown algorithm"},
		{[]string{"sim", "subsetting", "--backends", "1", "--subset", "1", "--churn"}, 2, "at least 2 backends"},
		{[]string{"sim", "subsetting", "--clients", "x"}, 2, "invalid value"},
		{[]string{"sim", "subsetting", "extra"}, 2, "unexpected argument"},
	} {
		var out, errb strings.Builder
		if code := run(context.Background(), tt.args, &out, &errb); code != tt.code || !strings.Contains(errb.String(), tt.errText) {
			t.Errorf("run(%q) = %d, stderr %q; want %d containing %q", tt.args, code, errb.String(), tt.code, tt.errText)
		}
	}
}

// scenarioJSON runs 'triage ARGS' and decodes the scenario's JSON: its
// name and headlines.
func scenarioJSON(t *testing.T, args ...string) (scenario string, headlines []sim.Headline) {
	t.Helper()
	var out, errb strings.Builder
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("%q: exit %d: %s", args, code, errb.String())
	}
	var r struct {
		Scenario  string         `json:"scenario"`
		Headlines []sim.Headline `json:"headlines"`
	}
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return r.Scenario, r.Headlines
}

// refused checks that each command exits 2 with a message.
func refused(t *testing.T, cmds ...[]string) {
	t.Helper()
	for _, bad := range cmds {
		var out, errb strings.Builder
		if code := run(context.Background(), bad, &out, &errb); code != 2 || errb.Len() == 0 {
			t.Errorf("%q: exit %d, stderr %q", bad, code, errb.String())
		}
	}
}

func simJSON(t *testing.T, args ...string) subsettingResult {
	t.Helper()
	var out, errb strings.Builder
	if code := run(context.Background(), append([]string{"sim", "subsetting", "--json"}, args...), &out, &errb); code != 0 {
		t.Fatalf("%q: exit %d: %s", args, code, errb.String())
	}
	var r subsettingResult
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		t.Fatalf("%q: %v in %q", args, err, out.String())
	}
	return r
}

// The book's figures through the command: deterministic gives every
// backend 10 of 300 clients' connections (Figure 20-5); random subsets of
// 30% and 10% spread widely (Figures 20-3 and 20-4); ringsteady keeps the
// spread and changes few subsets when a backend leaves.
func TestSimSubsettingFigures(t *testing.T) {
	det := simJSON(t, "--algorithm", "deterministic", "--subset", "10", "--churn")
	if det.Min != 10 || det.Max != 10 || len(det.Connections) != 300 || det.MinFrac != 1 || det.MaxFrac != 1 {
		t.Errorf("deterministic: %d..%d over %d backends", det.Min, det.Max, len(det.Connections))
	}
	if det.Churn == nil || *det.Churn < 0.9 {
		t.Errorf("deterministic churn %v", det.Churn)
	}
	for _, tc := range []struct {
		size             string
		loBelow, hiAbove float64
	}{{"90", 0.85, 1.15}, {"30", 0.7, 1.3}} {
		r := simJSON(t, "--algorithm", "random", "--subset", tc.size)
		if r.MinFrac > tc.loBelow || r.MaxFrac < tc.hiAbove {
			t.Errorf("random subset %s: %.2f..%.2f of the mean", tc.size, r.MinFrac, r.MaxFrac)
		}
	}
	// Every scenario's JSON has its headlines next to the book's figures.
	if det.Scenario != "subsetting" || len(det.Headlines) != 3 || det.Headlines[0].Book == nil || *det.Headlines[0].Book != 1 || det.Headlines[0].Value != 1 {
		t.Errorf("deterministic headlines: %q %+v", det.Scenario, det.Headlines)
	}
	if r := simJSON(t, "--algorithm", "random", "--subset", "90"); r.Headlines[0].Book == nil || *r.Headlines[0].Book != 0.63 || *r.Headlines[1].Book != 1.21 || r.Headlines[0].Value != r.MinFrac {
		t.Errorf("random 30%% headlines: %+v", r.Headlines)
	}
	if r := simJSON(t, "--clients", "100", "--algorithm", "random", "--subset", "90"); r.Headlines[0].Book != nil {
		t.Errorf("a case the book did not run has a book figure: %+v", r.Headlines)
	}
	uneven := simJSON(t, "--clients", "310", "--backends", "307", "--subset", "10")
	if uneven.Max-uneven.Min > 1 {
		t.Errorf("307 backends: connections %d..%d", uneven.Min, uneven.Max)
	}
	ring := simJSON(t, "--algorithm", "ringsteady", "--subset", "10", "--churn")
	if ring.Min != 10 || ring.Max != 10 || ring.Churn == nil || *ring.Churn > 10.0/300+1e-9 {
		t.Errorf("ringsteady: %d..%d, churn %v", ring.Min, ring.Max, ring.Churn)
	}
	var out, errb strings.Builder
	if code := run(context.Background(), []string{"sim", "subsetting", "--churn"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "min 10 (100% of the mean)") || !strings.Contains(out.String(), "churn:") {
		t.Errorf("table: exit %d, %q %q", code, out.String(), errb.String())
	}
}

// The scenario commands print the book's numbers, as a table or JSON, and
// refuse bad flags.
func TestSimScenarios(t *testing.T) {
	for _, tt := range []struct {
		args    []string
		code    int
		errText string
	}{
		{[]string{"sim", "retry", "--clients", "0"}, 2, "clients and backends in"},
		{[]string{"sim", "retry", "extra"}, 2, "unexpected argument"},
		{[]string{"sim", "throttle", "--seed", "x"}, 2, "invalid value"},
		{[]string{"sim", "stack", "--requests", "0"}, 2, "requests in"},
	} {
		var out, errb strings.Builder
		if code := run(context.Background(), tt.args, &out, &errb); code != tt.code || !strings.Contains(errb.String(), tt.errText) {
			t.Errorf("run(%q) = %d, stderr %q; want %d containing %q", tt.args, code, errb.String(), tt.code, tt.errText)
		}
	}
	var out, errb strings.Builder
	if code := run(context.Background(), []string{"sim", "retry", "--json", "--clients", "20", "--requests", "200"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var r struct {
		Scenario  string `json:"scenario"`
		Headlines []struct {
			Name  string   `json:"name"`
			Value float64  `json:"value"`
			Book  *float64 `json:"book"`
		} `json:"headlines"`
	}
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil || r.Scenario != "retry" || len(r.Headlines) == 0 {
		t.Fatalf("%v: %q", err, out.String())
	}
	if h := r.Headlines[0]; h.Book == nil || *h.Book != 3 || h.Value != 3 {
		t.Errorf("first headline %+v, want 3 attempts per request, book 3", h)
	}
	out.Reset()
	if code := run(context.Background(), []string{"sim", "retry", "--clients", "10", "--requests", "50"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "headline") {
		t.Errorf("table: exit %d, %q", code, out.String())
	}
}

// triage sim lb: a small run's JSON has the scenario and one spread and
// one waste headline per policy, with the book's 2x next to round robin;
// bad flags are refused with a message.
func TestSimLB(t *testing.T) {
	scenario, hs := scenarioJSON(t, "sim", "lb", "--json", "--clients", "20", "--backends", "20", "--subset", "5", "--requests", "20000")
	if scenario != "lb" || len(hs) != 6 {
		t.Fatalf("scenario %q with %d headlines", scenario, len(hs))
	}
	if h := hs[0]; h.Name != "utilization spread, round_robin" || h.Book == nil || *h.Book != 2 || !(h.Value >= 1) {
		t.Errorf("first headline %+v", h)
	}
	refused(t, []string{"sim", "lb", "--policies", "random"}, []string{"sim", "lb", "--backends", "1"},
		[]string{"sim", "lb", "--load", "1.5"}, []string{"sim", "lb", "--requests", "-3"})
}

func TestSimShed(t *testing.T) {
	dir := t.TempDir()
	if scenario, hs := scenarioJSON(t, "sim", "shed", "--json", "--duration", "3s", "--out", dir); scenario != "shed" || len(hs) != 11 {
		t.Fatalf("scenario %q, %d headlines", scenario, len(hs))
	}
	for _, f := range []string{"result.json", "criticality.svg", "index.html"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("--out: %s: %v", f, err)
		}
	}
	refused(t, []string{"sim", "shed", "--cores", "0"}, []string{"sim", "shed", "--cost", "1ns"}, []string{"sim", "shed", "--duration", "2h"})
}

func TestSimCascade(t *testing.T) {
	if scenario, hs := scenarioJSON(t, "sim", "cascade", "--json", "--tasks", "4", "--lost", "1", "--lose-at", "4s", "--duration", "10s"); scenario != "cascade" || len(hs) != 5 {
		t.Fatalf("scenario %q, %d headlines", scenario, len(hs))
	}
	refused(t, []string{"sim", "cascade", "--tasks", "5", "--lost", "5"}, []string{"sim", "cascade", "--load", "-1"})
	if scenario, hs := scenarioJSON(t, "sim", "throttling", "--json", "--duration", "24s"); scenario != "throttling" || len(hs) != 8 {
		t.Errorf("throttling: scenario %q, %d headlines", scenario, len(hs))
	}
	refused(t, []string{"sim", "throttling", "--tasks", "1"}, []string{"sim", "throttling", "--limit", "-1"}, []string{"sim", "throttling", "--duration", "1h"})
}
