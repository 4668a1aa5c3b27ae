package balancing

import "os"

// measuring reports whether TRIAGE_MEASURE=1 asks for measurements: full
// durations and the thresholds on rates, shares and latencies.
func measuring() bool { return os.Getenv("TRIAGE_MEASURE") == "1" }
