package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/inbox"
	"github.com/keysched/keysched/db/internal/dbtest"
)

// An fn that commits or rolls back Apply's transaction itself gets an error
// wrapping ErrTxEnded that says whether the ID was recorded, and Seen and a
// redelivery agree with it. (Before, a commit by fn gave (false, "commit:
// transaction has already been committed") while the ID was recorded,
// against the doc's "nothing was recorded".)
func TestApplyFnEndsTx(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		in, effects := setup(t, db)
		errFn := errors.New("fn failed")
		for _, c := range []struct {
			name     string
			end      func(tx *sql.Tx) error
			fnErr    error
			recorded bool
			says     string
		}{
			{"commit", (*sql.Tx).Commit, nil, true, "is recorded: fn committed"},
			{"commit-then-error", (*sql.Tx).Commit, errFn, true, "is recorded: fn committed"},
			{"rollback", (*sql.Tx).Rollback, nil, false, "is not recorded"},
		} {
			id := "evt-" + c.name
			ok, err := in.Apply(ctx, id, func(tx *sql.Tx) error {
				if err := effect(ctx, db, effects, id)(tx); err != nil {
					return err
				}
				if err := c.end(tx); err != nil {
					return err
				}
				return c.fnErr
			})
			require.False(t, ok, c.name)
			require.ErrorIs(t, err, inbox.ErrTxEnded, c.name)
			require.ErrorContains(t, err, c.says, c.name)
			if c.fnErr != nil {
				require.ErrorIs(t, err, c.fnErr, c.name)
			}
			seen, err := in.Seen(ctx, id)
			require.NoError(t, err)
			require.Equal(t, c.recorded, seen, c.name)
			// A redelivery with a well-behaved fn agrees.
			again, err := in.Apply(ctx, id, effect(ctx, db, effects, id))
			require.NoError(t, err, c.name)
			require.Equal(t, !c.recorded, again, c.name)
			require.Equal(t, 1, applied(t, db, effects, id), c.name)
		}

		v, err := inbox.NewVersions(db, inbox.WithTable(dbtest.Table(t, db, "ver")))
		require.NoError(t, err)
		require.NoError(t, v.CreateSchema(ctx))
		ok, err := v.Apply(ctx, "acct-1", 3, (*sql.Tx).Commit)
		require.False(t, ok)
		require.ErrorIs(t, err, inbox.ErrTxEnded)
		require.ErrorContains(t, err, "is at version 3: fn committed")
	})
}

// Found by attacking the code (adversarial review, 2026-12-02): a Versions
// fn that rolled back Apply's transaction, after which a newer version of
// the entity was stored, got ErrTxEnded saying "is at version 5: fn
// committed": the look after the rollback took any version at least as new
// for this one's commit.
//
// ErrTxEnded says fn committed only when the stored version is this one; a
// newer one stored since makes it say so, and not that fn committed.
func TestVersionsTxEndedDoesNotClaimANewerVersionAsFnsCommit(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		v, err := inbox.NewVersions(db, inbox.WithTable(dbtest.Table(t, db, "vernewer")))
		require.NoError(t, err)
		require.NoError(t, v.CreateSchema(ctx))
		ok, err := v.Apply(ctx, "acct-1", 3, func(tx *sql.Tx) error {
			if err := tx.Rollback(); err != nil {
				return err
			}
			// Another delivery, a newer version, lands meanwhile.
			newer, err := v.Apply(ctx, "acct-1", 5, func(*sql.Tx) error { return nil })
			if err != nil || !newer {
				return fmt.Errorf("version 5: %v, %w", newer, err)
			}
			return nil
		})
		require.False(t, ok)
		require.ErrorIs(t, err, inbox.ErrTxEnded)
		require.NotContains(t, err.Error(), "5: fn committed")
		require.ErrorContains(t, err, "at version 5")
	})
}
