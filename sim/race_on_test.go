//go:build race

package sim

// raceEnabled: the race detector makes the larger scenarios take a minute;
// .ci/run runs this package's tests again without it.
const raceEnabled = true
