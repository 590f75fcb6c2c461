//go:build race

package outbox_test

// raceEnabled is true when the tests run under the race detector, which
// makes every synchronisation (and SQLite's pure-Go engine) 5-20 times
// slower: the heaviest test, TestTwoRelaysOneKilled, runs on fewer keys
// there (see twoRelaysKeys).
const raceEnabled = true
