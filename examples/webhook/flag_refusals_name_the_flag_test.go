package main

import (
	"bytes"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Each refusal of a flag's value names the flag and what is wanted. Before:
// -backoff 0 and -backoff -1s were refused by the service naming
// RetryPolicy.InitialBackoff, -lease 1s naming LeaseDuration, a short
// -admin-token naming AdminToken; -log verbose listed no level; -backlog-sync 0
// was accepted (never sync: several instances answer 429 for ever) while
// every other 0-or-below duration flag is refused.
func TestFlagRefusalsNameTheFlagAndWhatIsWanted(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-backoff", "0"}, "-backoff 0s: need above 0"},
		{[]string{"-backoff", "-1s"}, "-backoff -1s: need above 0"},
		{[]string{"-lease", "1s"}, "-lease 1s: need at least twice -timeout plus a second (12s with -timeout 5s)"},
		{[]string{"-lease", "0"}, "-lease 0s: need at least twice -timeout"},
		{[]string{"-timeout", "20s", "-lease", "30s"}, "-lease 30s: need at least twice -timeout plus a second (42s with -timeout 20s)"},
		{[]string{"-admin-token", "short"}, "-admin-token (or $WEBHOOK_ADMIN_TOKEN) of 5 bytes: need at least 16"},
		{[]string{"-log", "verbose"}, `-log "verbose": need debug, info, warn or error`},
		{[]string{"-backlog-sync", "0"}, "-backlog-sync 0s: need above 0 (omit it for the default: 1s with -postgres, never with SQLite)"},
		{[]string{"-backlog-sync", "-1s"}, "-backlog-sync -1s: need above 0"},
	} {
		_, err := parseFlags(tc.args)
		require.ErrorContains(t, err, tc.want, "%q", tc.args)
		require.NotContains(t, err.Error(), "short", "a token is never shown")
	}

	o, err := parseFlags(nil)
	require.NoError(t, err)
	require.Equal(t, time.Duration(0), o.backlogSync, "not given, with SQLite: never")
	o, err = parseFlags([]string{"-postgres", "postgres://x"})
	require.NoError(t, err)
	require.Equal(t, time.Second, o.backlogSync, "not given, with -postgres: 1s")
	o, err = parseFlags([]string{"-backlog-sync", "200ms", "-log", "debug", "-lease", "12s"})
	require.NoError(t, err)
	require.Equal(t, 200*time.Millisecond, o.backlogSync)
	require.Equal(t, slog.LevelDebug, o.level)

	// -secrets-file: a missing file and a secret without "whsec_" say so.
	_, err = readSecrets(filepath.Join(t.TempDir(), "nonexistent"))
	require.ErrorContains(t, err, "-secrets-file: open ")
	require.ErrorContains(t, err, "need a file of lines 'partner whsec_...'")
	var logs bytes.Buffer
	err = keepConfiguredSecrets(map[string]string{"acme": "http://x"}, map[string][]string{"acme": {"c2VjcmV0-not"}},
		"-endpoints", slog.New(slog.NewTextHandler(&logs, nil)))
	require.ErrorContains(t, err, `-secrets-file, partner "acme", secret 1: signing: invalid secret: does not start with "whsec_"`)
	require.NotContains(t, err.Error(), "c2VjcmV0", "a secret is never shown")
}

// -lease not given follows -timeout as Config.LeaseDuration's default does
// (max(30s, 3 × -timeout)): -timeout 20s alone was refused with
// '-lease 30s: need at least ... 42s', naming a flag the user never gave,
// where the service given Timeout 20s alone starts.
func TestLeaseNotGivenFollowsTimeout(t *testing.T) {
	o, err := parseFlags([]string{"-timeout", "20s"})
	require.NoError(t, err)
	require.Equal(t, time.Minute, o.lease)
	o, err = parseFlags(nil)
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, o.lease, "the default with the default -timeout (5s)")
	o, err = parseFlags([]string{"-timeout", "20s", "-lease", "45s"})
	require.NoError(t, err)
	require.Equal(t, 45*time.Second, o.lease, "a -lease given stays")
}
