//go:build !race

package trace

const fullStreamUnderRace = false
