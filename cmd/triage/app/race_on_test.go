//go:build race

package app

// raceEnabled: under the race detector the drill's processes would run
// several times slower than the script assumes; .ci/run runs the drill's
// test again without it.
const raceEnabled = true
