//go:build race

package bus

// raceEnabled skips the tests too slow under the race detector.
const raceEnabled = true
