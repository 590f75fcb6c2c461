package inbox_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/inbox"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/sqldb"
	"github.com/keysched/keysched/internal/opttest"
)

// Each option New or NewVersions refuses is a *keysched.OptionError naming
// it, as every keysched module's refused option is (opttest.Problem): errors.As
// finds it, errors.Is matches inbox.ErrInvalidOption and
// keysched.ErrInvalidOption, and the text begins "inbox: invalid option: Name".
func TestRefusedOptionIsAnOptionErrorNamingIt(t *testing.T) {
	db := dbtest.SQLite(t)
	for _, tc := range []struct {
		versions bool // NewVersions, not New
		opts     []inbox.Option
		option   string
	}{
		{false, []inbox.Option{inbox.WithDialect(inbox.Dialect(9))}, "WithDialect"},
		{false, []inbox.Option{inbox.WithTable("x;y")}, "WithTable"},
		{false, []inbox.Option{inbox.WithRetention(0)}, "WithRetention"},
		{false, []inbox.Option{inbox.WithTable("t"), nil}, "opts[1]"},
		{true, []inbox.Option{inbox.WithTable("")}, "WithTable"},
		// Versions never expire.
		{true, []inbox.Option{inbox.WithRetention(time.Hour)}, "WithRetention"},
	} {
		var err error
		if tc.versions {
			_, err = inbox.NewVersions(db, tc.opts...)
		} else {
			_, err = inbox.New(db, tc.opts...)
		}
		require.Empty(t, opttest.Problem(err, opttest.Want{Option: tc.option,
			Prefix: "inbox: invalid option: ", Sentinels: []error{inbox.ErrInvalidOption}}))
	}
}

// Found by attacking the code (adversarial review, 2026-12-02): WithDialect
// naming the other database than the *sql.DB's driver was taken, and every
// call then failed with the database's syntax error ($1 on SQLite, ? on
// PostgreSQL).
//
// WithDialect contradicting a driver New recognises is refused
// (ErrInvalidOption, naming both), by New and NewVersions; the matching
// dialect is taken.
func TestWithDialectContradictingTheDriverIsRefused(t *testing.T) {
	for _, c := range []struct {
		db         func(testing.TB) *sql.DB
		right, bad inbox.Dialect
	}{
		{dbtest.SQLite, inbox.SQLite, inbox.Postgres},
		{dbtest.Postgres, inbox.Postgres, inbox.SQLite},
	} {
		db := c.db(t)
		_, err := inbox.New(db, inbox.WithDialect(c.bad))
		require.ErrorIs(t, err, inbox.ErrInvalidOption, "%v on %v", c.bad, c.right)
		require.ErrorContains(t, err, c.bad.String())
		require.ErrorContains(t, err, c.right.String())
		require.ErrorIs(t, err, sqldb.ErrDialectMismatch)
		_, err = inbox.NewVersions(db, inbox.WithDialect(c.bad))
		require.ErrorIs(t, err, inbox.ErrInvalidOption)
		_, err = inbox.New(db, inbox.WithDialect(c.right))
		require.NoError(t, err)
	}
}
