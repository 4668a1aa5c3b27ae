package sim

import (
	"testing"
	"time"
)

// Ten tasks at 80% of their capacity lose three for good: unprotected
// (queues without bound, clients retrying every failure), every survivor
// runs out of memory and the failure cascades; with triage's admission
// control, throttling and retry budget, the seven left serve their full
// capacity and none crashes.
func TestCascadeScenario(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("simulates about four million attempts; .ci/run runs it without the race detector")
	}
	r, err := Cascade(CascadeConfig{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	get := func(name string) float64 { return headlineValue(t, r, name) }
	if g := get("goodput before the loss, share of demand, triage"); g < 0.99 {
		t.Errorf("before the loss triage served %.3f of the demand", g)
	}
	if g, c := get("goodput after the loss, share of the survivors' capacity, triage"), get("task crashes, triage"); g < 0.95 || c != 0 {
		t.Errorf("triage: goodput %.3f of the survivors' capacity, %v crashes; want at least 0.95 and none", g, c)
	}
	if g, c := get("goodput after the loss, share of the survivors' capacity, unprotected"), get("task crashes, unprotected"); g > 0.6 || c < 7 {
		t.Errorf("unprotected: goodput %.3f, %v crashes; want the failure to cascade (every survivor crashing)", g, c)
	}
}

func TestCascadeConfigErrors(t *testing.T) {
	for _, c := range []CascadeConfig{
		{Tasks: 1}, {Tasks: 5, Lost: 5}, {Load: 3}, {Clients: -1}, {Cost: time.Nanosecond},
		{LoseAt: time.Second}, {Duration: time.Hour}, {Deadline: time.Millisecond},
	} {
		if _, err := Cascade(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
