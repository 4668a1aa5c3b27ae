// Package statetrace writes a bench server's state as JSON lines, one
// every interval until the process ends (TRIAGE_BENCH_TRACE=FILE): the
// per-interval record of a run that enters a bad state.
package statetrace

import (
	"encoding/json"
	"os"
	"time"
)

// Start appends sample's map to the file name every interval, with "t",
// the seconds since Start, added. sample runs on the tracing goroutine,
// one call at a time.
func Start(name string, interval time.Duration, sample func() map[string]any) error {
	f, err := os.OpenFile(name, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	start := time.Now()
	go func() {
		enc := json.NewEncoder(f)
		for range time.Tick(interval) {
			m := sample()
			m["t"] = time.Since(start).Seconds()
			enc.Encode(m)
		}
	}()
	return nil
}
