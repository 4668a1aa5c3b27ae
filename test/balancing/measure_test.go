package balancing

import (
	"flag"
	"os"
	"testing"

	"github.com/triagehq/triage/internal/testkit/loopback"
)

// measuring reports whether TRIAGE_MEASURE=1 asks for measurements
// (loopback.Measuring).
func measuring() bool { return loopback.Measuring() }

// alongside runs t beside the other real-time scenarios (loopback.Alongside).
func alongside(t *testing.T) { loopback.Alongside(t) }

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
