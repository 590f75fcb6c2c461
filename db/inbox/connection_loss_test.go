package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/inbox"
	"github.com/keysched/keysched/db/internal/dbtest"
)

// The connection dies between the effect and the commit (the backend
// terminated after fn's write, before Apply commits), and during the commit
// (terminated while a deferred constraint trigger holds the COMMIT for
// 1 s): Apply's error wraps ErrCommitUnknown and says what Seen found (not
// recorded); the effect did not commit either (the ID is recorded if and
// only if the effect is); the redelivery applies once, the next is "already
// handled".
func TestApplyConnectionLost(t *testing.T) {
	srv := dbtest.NewServer(t)
	admin := srv.Open(t)
	db := srv.Open(t)
	ctx := context.Background()
	in, effects := setup(t, db)
	// A trigger that runs at COMMIT (deferred) and sleeps there.
	_, err := admin.ExecContext(ctx, `CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(1); RETURN NULL; END $$`)
	require.NoError(t, err)
	_, err = admin.ExecContext(ctx, `CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON `+effects+`
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.id LIKE 'slow%') EXECUTE FUNCTION slow_commit()`)
	require.NoError(t, err)
	terminate := func(pid int) {
		_, err := admin.ExecContext(ctx, `SELECT pg_terminate_backend($1)`, pid)
		require.NoError(t, err)
	}
	for _, c := range []struct {
		name, id string
		kill     func(tx *sql.Tx, pid int) // from fn, after the effect
	}{
		{"before commit", "e1", func(_ *sql.Tx, pid int) { terminate(pid) }},
		{"during commit", "slow1", func(_ *sql.Tx, pid int) {
			go func() {
				// Wait until the backend sleeps in the commit's trigger.
				for {
					var n int
					require.NoError(t, admin.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'PgSleep'`, pid).Scan(&n))
					if n > 0 {
						terminate(pid)
						return
					}
				}
			}()
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ok, err := in.Apply(ctx, c.id, func(tx *sql.Tx) error {
				if err := effect(ctx, db, effects, c.id)(tx); err != nil {
					return err
				}
				var pid int
				if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					return err
				}
				c.kill(tx, pid)
				return nil
			})
			require.False(t, ok)
			t.Logf("Apply: %v", err)
			require.ErrorIs(t, err, inbox.ErrCommitUnknown)
			require.Contains(t, err.Error(), fmt.Sprintf("the ID %q is not recorded", c.id))
			seen, err := in.Seen(ctx, c.id)
			require.NoError(t, err)
			require.False(t, seen)
			require.Zero(t, applied(t, db, effects, c.id), "the effect did not commit either")
			for i, want := range []bool{true, false} {
				ok, err := in.Apply(ctx, c.id, effect(ctx, db, effects, c.id))
				require.NoError(t, err)
				require.Equal(t, want, ok, "delivery %d", i)
			}
			require.Equal(t, 1, applied(t, db, effects, c.id))
		})
	}
}
