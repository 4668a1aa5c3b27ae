package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"
)

// The test binary doubles as the backend, proxy and job processes, as the
// command does.
func TestMain(m *testing.M) {
	if subcommand() {
		return
	}
	os.Exit(m.Run())
}

// A short run end to end, real processes and sockets: a small job through
// the proxy and straight; the job completes both ways, and only the direct
// one connects every task to the backend. Each task's calls take the
// backend about 20 ms of CPU (the twenty tasks' together some 400 ms), so
// that every task still holds its connection when the last one opens and
// the backend's 10 ms sampling sees them all; with 3 calls of 200 µs a
// task could finish before another started, and the straight run's peak
// read 17 or 19 in about one run in twenty.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts backend and proxy processes")
	}
	c := config{tasks: 20, calls: 10, rate: 50, cost: 200 * time.Microsecond, batchCost: 2 * time.Millisecond,
		before: time.Second, deadline: 20 * time.Second, repeats: 1, variants: "proxy,direct", asJSON: true}
	var out bytes.Buffer
	if err := run(context.Background(), c, &out); err != nil {
		t.Fatal(err)
	}
	var rep struct{ Results []result }
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || len(rep.Results) != 2 {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, r := range rep.Results {
		if r.JobCallsDone != 200 || r.InteractiveN == 0 || r.InteractiveOK < 0.9 {
			t.Errorf("%s: %+v", r.Variant, r)
		}
	}
	if px, direct := rep.Results[0], rep.Results[1]; px.BackendPeak >= direct.BackendPeak || direct.BackendPeak < 20 {
		t.Errorf("backend peak connections: %d through the proxy, %d straight", px.BackendPeak, direct.BackendPeak)
	}
}
