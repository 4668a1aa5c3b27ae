//go:build race

package drill

// raceEnabled: under the race detector, sync.Pool drops a quarter of what
// is put back (to find code that relies on getting it back).
const raceEnabled = true
