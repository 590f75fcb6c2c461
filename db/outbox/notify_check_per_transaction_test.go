package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// The NOTIFY trigger reads <table>_idle once per transaction, at its first
// inserting statement: a transaction that saw no idle relay there notifies
// nobody, even if a relay's idle row is live at its later inserts (the
// price: the relay's next poll finds the write). The next transaction on
// the same connection checks again: the mark that a transaction has checked
// is transaction-local.
func TestNotifyTriggerChecksTheIdleTableOncePerTransaction(t *testing.T) {
	db := dbtest.Postgres(t)
	ctx := context.Background()
	ob := newOutbox(t, db)
	listener := listenTo(t, db, ob)
	writer, err := db.Conn(ctx) // one session for every transaction below
	require.NoError(t, err)
	defer writer.Close()

	// First insert with no idle relay; then a relay goes idle (its row
	// visible to the transaction's later statements); a second insert.
	tx, err := writer.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = ob.Write(ctx, tx, outbox.Event{Key: "k", Payload: []byte("checked: no idle relay")})
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `INSERT INTO `+ob.Table()+`_idle (token, until) VALUES ('live', now() + interval '1 minute')`)
	require.NoError(t, err)
	_, err = ob.Write(ctx, tx, outbox.Event{Key: "k", Payload: []byte("not checked again")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	// The next transaction of the session checks again, and notifies.
	tx, err = writer.BeginTx(ctx, nil)
	require.NoError(t, err)
	for _, p := range []string{"checked: a relay is idle", "one notification per transaction"} {
		_, err = ob.Write(ctx, tx, outbox.Event{Key: "k", Payload: []byte(p)})
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit())

	// Had the first transaction notified, a second notification would
	// come right after the first.
	got, err := notifications(listener)
	require.NotZero(t, got, "no notification from the transaction that saw an idle relay: %v", err)
	require.Equal(t, 1, got, "notifications: only the second transaction's")
}
