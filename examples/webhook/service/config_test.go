package service

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
)

// Config's fields meet by keysched.Option's rule (see Config): the
// LeaseDuration default gives way to Timeout and PollInterval; a
// LeaseDuration given stays (the relay lowers the poll to a third of it); a
// LeaseDuration below twice Timeout plus a second (the relay's sink timeout)
// is refused.
func TestConfigFieldsMeetByOneRule(t *testing.T) {
	for _, tc := range []struct {
		name          string
		timeout, poll time.Duration
		lease         time.Duration // given; 0: the default
		want          time.Duration // the lease New settles on; 0: refused
	}{
		{"defaults", 0, 0, 0, 30 * time.Second},
		{"a long timeout raises the default lease", 20 * time.Second, 0, 0, 60 * time.Second},
		{"a long poll raises the default lease", 0, 40 * time.Second, 0, 120 * time.Second},
		{"a lease given stays", 0, 40 * time.Second, 31 * time.Second, 31 * time.Second},
		{"a lease at the timeout is refused", 5 * time.Second, 0, 5 * time.Second, 0},
		// The relay's sink timeout is Timeout + 1 s and needs twice that
		// as its lease: a lease just below it is refused by New, as a
		// Config error, not by the relay later.
		{"a lease below twice the sink timeout is refused", 5 * time.Second, 0, 12*time.Second - 1, 0},
		{"a lease of twice the sink timeout stays", 5 * time.Second, 0, 12 * time.Second, 12 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Partners: map[string]string{"p": "http://x"}, Store: &Store{},
				Secrets: map[string][]string{"p": {testSecret(t).Encode()}},
				Timeout: tc.timeout, PollInterval: tc.poll, LeaseDuration: tc.lease}
			err := c.defaults()
			if tc.want == 0 {
				require.ErrorIs(t, err, ErrInvalidConfig)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, c.LeaseDuration)
		})
	}
}

// A Retry policy keysched refuses is a bad Config, and says which field.
func TestBadRetryIsInvalidConfig(t *testing.T) {
	st, err := OpenSQLite(t.Context(), filepath.Join(t.TempDir(), "webhook.db"))
	require.NoError(t, err)
	defer st.Close()
	cfg := quickConfig()
	cfg.Partners, cfg.Store = map[string]string{"p": "http://127.0.0.1:1"}, st
	cfg.Secrets = map[string][]string{"p": {testSecret(t).Encode()}}
	cfg.Retry = keysched.RetryPolicy{MaxAttempts: 3} // no InitialBackoff
	_, err = New(t.Context(), cfg)
	require.ErrorIs(t, err, ErrInvalidConfig)
	var oe *keysched.OptionError
	require.True(t, errors.As(err, &oe), "%v", err)
	require.Equal(t, "WithRetry", oe.Option)
	require.Contains(t, err.Error(), "Retry: ")
}

// Config.Secrets stays strict (every key a partner), but its refusal says
// what to do; it only named the partner ("Secrets for "initech", which is
// no partner").
func TestSecretsOfNoPartnerSayWhatToDo(t *testing.T) {
	c := Config{Partners: map[string]string{"acme": "http://x"}, Store: &Store{},
		Secrets: map[string][]string{"acme": {testSecret(t).Encode()}, "initech": {testSecret(t).Encode()}}}
	err := c.defaults()
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, `"initech", which is not in Config.Partners: to remove the partner, remove its secrets too`)
	require.ErrorContains(t, err, "ErrUnconfiguredPartner")
}
