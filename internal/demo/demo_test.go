package demo

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

func TestRunShowsPropagationSpoofingAndOutcomes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	res, err := Run(ctx, &out, Options{Requests: 3})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		status  int
		outcome string
		arrived []string
	}{
		"checkout":                            {200, "", []string{"front:CRITICAL_PLUS/0", "A:CRITICAL_PLUS/0", "B:CRITICAL_PLUS/0"}},
		"spoofed CRITICAL_PLUS header":        {200, "", []string{"front:SHEDDABLE/0", "A:SHEDDABLE/0", "B:SHEDDABLE/0"}},
		"trusted proxy sets SHEDDABLE":        {200, "", []string{"front:SHEDDABLE/0", "A:SHEDDABLE/0", "B:SHEDDABLE/0"}},
		"A overrides: prefetch is SHEDDABLE":  {200, "", []string{"front:CRITICAL_PLUS/0", "A:CRITICAL_PLUS/0", "B:SHEDDABLE/0"}},
		"B task overloaded -> A: don't retry": {503, "overloaded-dont-retry", []string{"A:CRITICAL/0"}},
		"B out of quota -> 429":               {429, "out-of-quota", []string{"B:CRITICAL/0"}},
	}
	seen := 0
	for _, r := range res.Rows {
		w, ok := want[r.Scenario.Name]
		if !ok {
			continue
		}
		seen++
		if r.Status[w.status] != 3 || r.Errors != 0 {
			t.Errorf("%s: statuses %v, errors %d", r.Scenario.Name, r.Status, r.Errors)
		}
		if w.outcome != "" && r.Outcome[w.outcome] != 3 {
			t.Errorf("%s: outcomes %v", r.Scenario.Name, r.Outcome)
		}
		for _, a := range w.arrived {
			if r.Arrived[a] != 3 {
				t.Errorf("%s: arrivals %v, want %s x3", r.Scenario.Name, r.Arrived, a)
			}
		}
	}
	for _, r := range res.Rows {
		if r.Scenario.Body != "overload" {
			continue
		}
		// Only the layer directly above B retried: A retried B (attempt
		// counters 1 and 2 arrived), the frontend never retried A.
		if r.Arrived["B:CRITICAL/1"] == 0 || r.Arrived["A:CRITICAL/1"] != 0 || r.Arrived["A:CRITICAL/2"] != 0 {
			t.Errorf("overload: arrivals %v; want A retrying B and nobody retrying A", r.Arrived)
		}
	}
	if seen != len(want) {
		t.Fatalf("saw %d of %d scenarios", seen, len(want))
	}
	if res.Metrics["triage_untrusted_keys_stripped_total{key=triage-criticality}"] != 3 {
		t.Errorf("stripped metric: %v", res.Metrics)
	}
	if !strings.Contains(out.String(), "WHAT EACH TIER SAW") {
		t.Errorf("output lacks the table:\n%s", out.String())
	}
}

func TestRunRefusesBadConfig(t *testing.T) {
	_, err := Run(context.Background(), io.Discard, Options{Config: []byte("criticality:\n  default: HIGH\n")})
	if err == nil || !strings.Contains(err.Error(), "HIGH") {
		t.Fatalf("err = %v", err)
	}
}

func TestRunStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, io.Discard, Options{Requests: 1000}); err == nil {
		t.Fatal("cancelled run reported success")
	}
}
