//go:build race

package keysched

// raceEnabled is true when the tests run under the race detector, which makes
// every synchronisation operation 5-20 times slower: tests that push a million
// tasks through use a smaller count there (still far above what a leak or a
// lost wake-up needs to show).
const raceEnabled = true
