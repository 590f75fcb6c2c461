package main

import (
	"context"
	"io"
	"log/slog"
	"math"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// Flags that feed arithmetic were taken as given: -sim-rate 1e10 or +Inf
// made the producer's ticker interval 0 and NewTicker panicked in its
// goroutine (the service died); -dest-rate +Inf was converted to an int
// burst out of range; a partner named twice in -endpoints silently lost
// its first URL.
func TestFlagsRefuseBadValues(t *testing.T) {
	for _, args := range [][]string{
		{"-sim-rate", "1e10"},
		{"-sim-rate", "+Inf"},
		{"-sim-rate", "NaN"},
		{"-sim-rate", "-1"},
		{"-dest-rate", "+Inf"},
		{"-dest-rate", "0"},
		{"-dest-rate", "NaN"},
		{"-partners", "0"},
		{"-partners", "-3"},
		{"-history", "30s"},
		{"extra"},
	} {
		_, err := parseFlags(args)
		require.Error(t, err, "%q", args)
	}
	o, err := parseFlags([]string{"-sim-rate", "0", "-dest-rate", "50", "-partners", "3"})
	require.NoError(t, err)
	require.Equal(t, 3, o.partners)
	_, err = parseFlags([]string{"-endpoints", "a=http://x", "-secrets-file", "s", "-partners", "0"})
	require.NoError(t, err, "-partners is the simulation's only")
	_, err = parseFlags([]string{"-endpoints", "a=http://x"})
	require.ErrorContains(t, err, "-secrets-file", "real endpoints need their secrets")

	_, err = parseEndpoints("a=http://x,b=http://y, a=http://z")
	require.ErrorContains(t, err, `partner "a" given twice`)
	for _, bad := range []string{"a", "=http://x", "a=", "a=http://x,"} {
		_, err = parseEndpoints(bad)
		require.Error(t, err, bad)
	}
	p, err := parseEndpoints(" a=http://x/h?k=v , b=http://y")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"a": "http://x/h?k=v", "b": "http://y"}, p)
}

// The producer itself at the highest rate the flag allows, and beyond:
// it runs (its ticker does not panic) and stops with its context.
func TestProduceAtExtremeRates(t *testing.T) {
	for _, rate := range []float64{maxSimRate, 1e12, math.Inf(1)} {
		t.Run(strconv.FormatFloat(rate, 'g', -1, 64), func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			produce(ctx, "http://127.0.0.1:1", []string{"p"}, rate, slog.New(slog.NewTextHandler(io.Discard, nil)))
		})
	}
}

// -secrets-file: one line per partner, the current secret first; comments
// and blank lines skipped; a partner twice or without a secret is an error.
func TestSecretsFileParses(t *testing.T) {
	got, err := parseSecrets("# acme rotates\nacme whsec_new whsec_old\n\n  globex   whsec_g  \n")
	require.NoError(t, err)
	require.Equal(t, map[string][]string{"acme": {"whsec_new", "whsec_old"}, "globex": {"whsec_g"}}, got)
	_, err = parseSecrets("acme\n")
	require.ErrorContains(t, err, "line 1")
	_, err = parseSecrets("acme whsec_a\nacme whsec_b\n")
	require.ErrorContains(t, err, "given twice")
}

// The admin address needs a token unless it listens on loopback only; then
// the token is optional (the program warns).
func TestAdminTokenRequiredBeyondLoopback(t *testing.T) {
	for addr, loop := range map[string]bool{
		"127.0.0.1:8081": true, "127.0.0.2:0": true, "[::1]:8081": true, "localhost:8081": true,
		":8081": false, "0.0.0.0:8081": false, "[::]:8081": false, "10.0.0.5:8081": false, "example.com:8081": false, "garbage": false,
	} {
		require.Equal(t, loop, loopbackOnly(addr), addr)
		_, err := parseFlags([]string{"-admin", addr})
		if loop {
			require.NoError(t, err, addr)
		} else {
			require.ErrorContains(t, err, "-admin-token", addr)
		}
		_, err = parseFlags([]string{"-admin", addr, "-admin-token", "0123456789abcdef"})
		require.NoError(t, err, addr)
	}
	t.Setenv("WEBHOOK_ADMIN_TOKEN", "0123456789abcdef")
	o, err := parseFlags([]string{"-admin", ":8081"})
	require.NoError(t, err)
	require.Equal(t, "0123456789abcdef", o.adminToken)
}

// The usage (printed by -h and by every flag the parser refuses) never
// shows $WEBHOOK_ADMIN_TOKEN: it was the -admin-token flag's default, and
// the flag package printed it as (default "<the token>") on stderr, where
// logs keep it. The environment's token is still the default, and an
// -admin-token given (even empty) still wins.
func TestAdminTokenFromTheEnvironmentIsNeverShownInTheUsage(t *testing.T) {
	const token = "env-token-0123456789abcdef"
	t.Setenv("WEBHOOK_ADMIN_TOKEN", token)
	for _, args := range [][]string{{"-h"}, {"-no-such-flag"}, {"-attempts", "x"}} {
		r, w, err := os.Pipe()
		require.NoError(t, err)
		stderr := os.Stderr
		os.Stderr = w
		_, perr := parseFlags(args)
		os.Stderr = stderr
		require.NoError(t, w.Close())
		usage, err := io.ReadAll(r)
		require.NoError(t, err)
		require.NoError(t, r.Close())
		require.Error(t, perr, "%q", args)
		require.Contains(t, string(usage), "-admin-token", "%q: the usage was printed", args)
		require.NotContains(t, string(usage), token, "%q", args)
	}
	o, err := parseFlags(nil)
	require.NoError(t, err)
	require.Equal(t, token, o.adminToken)
	o, err = parseFlags([]string{"-admin-token", ""})
	require.NoError(t, err)
	require.Equal(t, "", o.adminToken, "an -admin-token given wins, even empty")
}
