//go:build !race

package keysched_test

const fullStreamUnderRace = false
