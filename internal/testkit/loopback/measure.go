package loopback

import (
	"os"
	"testing"
)

// Measuring reports whether TRIAGE_MEASURE=1 asks for measurements: full
// durations and the thresholds on rates, shares and latencies.
func Measuring() bool { return os.Getenv("TRIAGE_MEASURE") == "1" }

// Alongside runs t beside the other scenarios that call it, in go test
// ./... (their time is mostly waiting on real time, at a few hundred
// requests a second each; a package's TestMain may raise -test.parallel
// for them); measurements (TRIAGE_MEASURE=1) run alone,
// and so does every scenario under the race detector, which multiplies
// what each request costs (four at once then overloaded the rolling
// restart's backends: 482 of 2,922 calls failed).
func Alongside(t *testing.T) {
	if !Measuring() && !RaceEnabled {
		t.Parallel()
	}
}
