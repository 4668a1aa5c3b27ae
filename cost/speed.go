package cost

import (
	"crypto/sha256"
	"errors"
	"time"
)

// ReferenceRate is the reference core of normalised CPU-seconds, in
// rounds of MeasureSpeed's loop (SHA-256 of 32 bytes) per second: about a
// core of a 2020s x86 server.
const ReferenceRate = 10e6

// MeasureSpeed runs a reference loop (SHA-256 over 32 bytes) for about d
// in ten slices and returns this machine's speed against ReferenceRate
// (WithSpeed), from the fastest slice, so that a neighbour's burst does
// not make the machine look slow. It spends d of CPU on the calling
// goroutine: call it once, at start-up. On a shared or throttled machine
// the result varies from run to run by as much as the machine does (tens
// of percent on small VMs); configure the speed per machine type where
// quotas must be exact. d must be in [10ms, 10s].
func MeasureSpeed(d time.Duration) (float64, error) {
	if d < 10*time.Millisecond || d > 10*time.Second {
		return 0, errors.New("cost: MeasureSpeed duration out of [10ms, 10s]")
	}
	var sum [32]byte
	best := 0.0
	for range 10 {
		n := 0
		start := time.Now()
		for time.Since(start) < d/10 {
			for range 256 {
				sum = sha256.Sum256(sum[:])
			}
			n += 256
		}
		best = max(best, float64(n)/time.Since(start).Seconds())
	}
	_ = sum
	return best / ReferenceRate, nil
}
