package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/internal/opttest"
)

// Write's INSERT runs whether or not its statement notifies (the
// data-modifying CTE runs to completion when the outer SELECT returns no
// row), and fails as before: a duplicate ID is ErrDuplicateID and aborts the
// transaction.
func TestNotifyFromWriteInsertsWhenNoRelayIsIdle(t *testing.T) {
	db := dbtest.Postgres(t)
	ctx := context.Background()
	ob := newOutboxNotifyFromWrite(t, db)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	id, err := ob.Write(ctx, tx, outbox.Event{Key: "k", Type: "t", Payload: []byte("p")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	var key, typ, payload string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT key, type, payload FROM `+ob.Table()+` WHERE id = $1 AND state = 0`, id).Scan(&key, &typ, &payload))
	require.Equal(t, [3]string{"k", "t", "p"}, [3]string{key, typ, payload})

	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	_, err = ob.Write(ctx, tx, outbox.Event{ID: id, Key: "k"})
	require.ErrorIs(t, err, outbox.ErrDuplicateID)
	// PostgreSQL aborted tx: any later statement fails.
	_, err = ob.Write(ctx, tx, outbox.Event{Key: "k"})
	require.Error(t, err)
	require.False(t, errors.Is(err, outbox.ErrDuplicateID), "a statement in the aborted transaction: %v", err)
	require.Error(t, tx.Commit())
	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+ob.Table()).Scan(&n))
	require.Equal(t, 1, n, "rows")
}

// CreateSchema under WithNotifyFromWrite drops the trigger of a table made
// with it, and WithNotify(true) alone brings it back. WithNotifyFromWrite
// given with WithNotify(false) is refused, in either order; on SQLite the
// option changes nothing.
func TestNotifyFromWriteSwitchesTheTriggerOff(t *testing.T) {
	db := dbtest.Postgres(t)
	ctx := context.Background()
	table := dbtest.Table(t, db, "ob")
	trigger, err := outbox.New(db, outbox.WithTable(table))
	require.NoError(t, err)
	fromWrite, err := outbox.New(db, outbox.WithTable(table), outbox.WithNotifyFromWrite())
	require.NoError(t, err)
	for _, step := range []struct {
		ob   *outbox.Outbox
		want int
	}{{trigger, 1}, {fromWrite, 0}, {fromWrite, 0}, {trigger, 1}, {fromWrite, 0}} {
		require.NoError(t, step.ob.CreateSchema(ctx))
		tr, fn := notifyTriggers(t, db, table)
		require.Equal(t, [2]int{step.want, step.want}, [2]int{tr, fn}, "trigger and function after CreateSchema")
	}

	for _, opts := range [][]outbox.Option{
		{outbox.WithNotify(false), outbox.WithNotifyFromWrite()},
		{outbox.WithNotifyFromWrite(), outbox.WithNotify(false)},
	} {
		ob, err := outbox.New(db, opts...)
		require.Nil(t, ob)
		require.Empty(t, opttest.Problem(err, opttest.Want{Option: "WithNotifyFromWrite", With: "WithNotify",
			Prefix: "outbox: invalid option: ", Sentinels: []error{outbox.ErrInvalidOption}}))
	}

	lite, err := outbox.New(dbtest.SQLite(t), outbox.WithNotifyFromWrite())
	require.NoError(t, err)
	require.NoError(t, lite.CreateSchema(ctx))
	tx, err := lite.DB().BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = lite.Write(ctx, tx, outbox.Event{Key: "k"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
}

// Under WithNotifyFromWrite, Write reads the idle table: on a schema without
// it (made before it existed) Write fails with ErrNoSchema and the database's error, and
// works once CreateSchema has created it.
func TestNotifyFromWriteNeedsTheIdleTable(t *testing.T) {
	db := dbtest.Postgres(t)
	ctx := context.Background()
	ob := newOutboxNotifyFromWrite(t, db)
	_, err := db.ExecContext(ctx, `DROP TABLE `+ob.Table()+`_idle`)
	require.NoError(t, err)
	write := func() error {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback()
		if _, err := ob.Write(ctx, tx, outbox.Event{Key: "k"}); err != nil {
			return err
		}
		return tx.Commit()
	}
	err = write()
	require.ErrorContains(t, err, ob.Table()+"_idle")
	require.ErrorIs(t, err, outbox.ErrNoSchema, "Write says to run CreateSchema")
	require.NoError(t, ob.CreateSchema(ctx))
	require.NoError(t, write())
}
