package e2e

import (
	"flag"
	"os"
	"testing"
)

// measuring reports whether TRIAGE_MEASURE=1 asks for measurements: full
// durations and the thresholds on rates, shares and latencies.
func measuring() bool { return os.Getenv("TRIAGE_MEASURE") == "1" }

// alongside runs t beside the other scenarios that call it, in go test
// ./... (their time is mostly waiting on real time, at a few hundred
// requests a second each); measurements (TRIAGE_MEASURE=1) run alone,
// and so does every scenario under the race detector, which multiplies
// what each request costs (four at once then overloaded the rolling
// restart's backends: 482 of 2,922 calls failed).
func alongside(t *testing.T) {
	if !measuring() && !raceEnabled {
		t.Parallel()
	}
}

// TestMain runs the scenarios that call alongside four at once unless the
// command line sets -test.parallel: they wait on real time, so the
// default of one per CPU would leave the machine idle.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		flag.Set("test.parallel", "4")
	}
	os.Exit(m.Run())
}
