//go:build !race

package balancing

const raceEnabled = false
