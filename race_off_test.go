//go:build !race

package keysched

const raceEnabled = false
