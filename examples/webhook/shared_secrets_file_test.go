package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/examples/webhook/service"
	"github.com/keysched/keysched/examples/webhook/signing"
)

// One -secrets-file holding every partner's secrets serves an instance
// whose -endpoints name only some of them (a partner removed from
// -endpoints keeps its line): the others' secrets are ignored with one Warn
// line naming them and the flag. Before, the start was refused with
// `invalid config: Secrets for "initech", which is no partner`, hiding both
// a bad URL of a configured partner and ErrUnconfiguredPartner. A partner
// of -endpoints without a secret is still refused, naming -secrets-file.
func TestSharedSecretsFileServesASubsetOfPartners(t *testing.T) {
	sec := func() string {
		s, err := signing.NewSecret()
		require.NoError(t, err)
		return s.Encode()
	}
	file := "acme " + sec() + "\ninitech " + sec() + "\nglobex " + sec() + "\n"
	endpoints := func(eps string) (map[string]string, map[string][]string, string, error) {
		secrets, err := parseSecrets(file)
		require.NoError(t, err)
		var logs bytes.Buffer
		p, err := endpointPartners(options{endpoints: eps, secretsFile: "s.txt"}, secrets,
			slog.New(slog.NewTextHandler(&logs, nil)))
		return p, secrets, logs.String(), err
	}

	partners, secrets, logs, err := endpoints("acme=http://127.0.0.1:1/hook")
	require.NoError(t, err)
	require.Equal(t, []string{"acme"}, keys(secrets))
	require.Equal(t, 1, strings.Count(logs, "level=WARN"), logs)
	require.Contains(t, logs, "-secrets-file")
	require.Contains(t, logs, "-endpoints")
	require.Contains(t, logs, "partners=globex,initech")

	// The service starts with what is kept.
	ctx := context.Background()
	store, err := service.OpenSQLite(ctx, filepath.Join(t.TempDir(), "w.db"))
	require.NoError(t, err)
	defer store.Close()
	quiet := slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))
	svc, err := service.New(ctx, service.Config{Partners: partners, Secrets: secrets, Store: store, Logger: quiet})
	require.NoError(t, err)
	require.NoError(t, svc.Close(ctx))

	// Removing a partner whose events wait: the start names them
	// (ErrUnconfiguredPartner, with what to do), not its secrets.
	all, allSecrets, _, err := endpoints("acme=http://127.0.0.1:1/hook,initech=http://127.0.0.1:1/hook")
	require.NoError(t, err)
	svc, err = service.New(ctx, service.Config{Partners: all, Secrets: allSecrets, Store: store, Logger: quiet})
	require.NoError(t, err)
	intake := httptest.NewServer(svc.IntakeHandler())
	resp, err := http.Post(intake.URL+"/events/initech", "application/json", strings.NewReader(`{"type":"a.b","data":{}}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	intake.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	_ = svc.Close(cctx) // its delivery to a closed port may still be in flight
	cancel()
	_, err = service.New(ctx, service.Config{Partners: partners, Secrets: secrets, Store: store, Logger: quiet})
	require.ErrorIs(t, err, service.ErrUnconfiguredPartner)
	require.ErrorContains(t, err, `"initech" (1 undelivered)`)

	// A bad URL of the partner kept is what the start reports.
	partners, secrets, _, err = endpoints("acme=ftp://x")
	require.NoError(t, err)
	_, err = service.New(ctx, service.Config{Partners: partners, Secrets: secrets, Store: store, Logger: quiet})
	require.ErrorContains(t, err, "ftp://x")
	require.NotContains(t, err.Error(), "Secrets")

	// A configured partner without a secret is refused, naming the flag.
	_, _, _, err = endpoints("acme=http://127.0.0.1:1/hook,hooli=http://127.0.0.1:1/hook")
	require.ErrorContains(t, err, `-secrets-file s.txt has no secret for partner "hooli" of -endpoints: add a line 'hooli whsec_...'`)
}

func keys(m map[string][]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A -secrets-file line whose partner name was left out ('whsec_old
// whsec_new', a rotation pair pasted alone) never shows its first secret:
// it is refused naming the line, not taken for a partner not configured
// and logged in the Warn line (it was: 'partners=whsec_...'). A first word
// that reads as a secret without the prefix (plain base64) is kept, as a
// long partner name may, but the Warn line does not show it.
func TestSecretsFileLineWithoutAPartnerNeverShowsTheSecret(t *testing.T) {
	s1, err := signing.NewSecret()
	require.NoError(t, err)
	s2, err := signing.NewSecret()
	require.NoError(t, err)
	_, err = parseSecrets("acme " + s2.Encode() + "\n" + s1.Encode() + " " + s2.Encode() + "\n")
	require.ErrorContains(t, err, "-secrets-file line 2: ")
	require.ErrorContains(t, err, "need 'partner whsec_...'")
	require.NotContains(t, err.Error(), strings.TrimPrefix(s1.Encode(), signing.SecretPrefix))

	raw := strings.TrimPrefix(s1.Encode(), signing.SecretPrefix)
	secrets, err := parseSecrets("acme " + s2.Encode() + "\nglobex " + s2.Encode() + "\n" + raw + " " + s2.Encode() + "\n")
	require.NoError(t, err)
	var logs bytes.Buffer
	err = keepConfiguredSecrets(map[string]string{"acme": "http://x"}, secrets, "-endpoints", slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)
	require.Equal(t, []string{"acme"}, keys(secrets))
	require.NotContains(t, logs.String(), raw, "a secret is never logged")
	require.Contains(t, logs.String(), "partners=globex")
}

// A -secrets-file saved with a UTF-8 byte order mark (Windows editors)
// serves its first line's partner: the mark was read as part of the name
// ("\ufeffacme"), so acme had no secret and its line was ignored as a
// partner not configured.
func TestSecretsFileWithAByteOrderMarkServesItsFirstPartner(t *testing.T) {
	s, err := signing.NewSecret()
	require.NoError(t, err)
	secrets, err := parseSecrets("\ufeffacme " + s.Encode() + "\r\n")
	require.NoError(t, err)
	require.Equal(t, map[string][]string{"acme": {s.Encode()}}, secrets)
}
