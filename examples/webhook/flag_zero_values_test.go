package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A flag whose zero the Config reads as "the default" was accepted and
// silently replaced (-timeout 0 became Config.Timeout's 10 s, not the
// flag's 5 s), while -partners 0, -dest-concurrency 0 and -attempts 0 were
// refused: every such zero is now refused, naming its flag.
func TestFlagsRefuseZeroNamingTheFlag(t *testing.T) {
	for _, args := range [][]string{
		{"-workers", "0"},
		{"-workers", "-1"},
		{"-timeout", "0"},
		{"-max-backlog", "0"},
		{"-relay-name", ""},
		{"-attempts", "0"},
		{"-dest-concurrency", "0"},
		{"-lease", "0"},
		{"-max-retry-after", "0"},
		{"-breaker-failures", "0"},
		{"-breaker-open", "0"},
	} {
		_, err := parseFlags(args)
		require.ErrorContains(t, err, args[0]+" ", "%q", args)
	}
}
