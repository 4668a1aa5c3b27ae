//go:build race

package balancing

// raceEnabled: the race detector multiplies the CPU every request costs
// and adds its own background work.
const raceEnabled = true
