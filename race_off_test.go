//go:build !race

package keysched

// raceEnabled: see race_on_test.go.
const raceEnabled = false
