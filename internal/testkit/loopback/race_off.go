//go:build !race

package loopback

// RaceEnabled says the race detector is on.
const RaceEnabled = false
