//go:build race

package loopback

// RaceEnabled says the race detector is on: it multiplies the CPU every
// request costs and adds its own background work.
const RaceEnabled = true
