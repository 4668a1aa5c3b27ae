//go:build race

package e2e

// raceEnabled: the race detector multiplies the CPU every request costs
// and adds its own background work.
const raceEnabled = true
