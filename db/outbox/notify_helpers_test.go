package outbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// commitEvent writes one event of key k in a transaction of its own.
func commitEvent(t *testing.T, ob *outbox.Outbox, k, payload string) {
	t.Helper()
	ctx := context.Background()
	tx, err := ob.DB().BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = ob.Write(ctx, tx, outbox.Event{Key: k, Payload: []byte(payload)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
}

// newOutboxNotifyFromWrite makes an outbox WithNotifyFromWrite on a fresh
// table of db, with its schema.
func newOutboxNotifyFromWrite(t *testing.T, db *sql.DB) *outbox.Outbox {
	t.Helper()
	ob, err := outbox.New(db, outbox.WithTable(dbtest.Table(t, db, "ob")), outbox.WithNotifyFromWrite())
	require.NoError(t, err)
	require.NoError(t, ob.CreateSchema(context.Background()))
	return ob
}

// listenTo opens a session of db that LISTENs on ob's channel (its table's
// name); it is closed when the test ends.
func listenTo(t *testing.T, db *sql.DB, ob *outbox.Outbox) *sql.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = conn.ExecContext(ctx, `UNLISTEN *`)
		conn.Close()
	})
	require.NoError(t, conn.Raw(func(dc any) error {
		_, err := dc.(*stdlib.Conn).Conn().Exec(ctx, `LISTEN "`+ob.Table()+`"`)
		return err
	}))
	return conn
}

// notifications counts the notifications conn (listenTo's) receives: it
// waits up to 30 s for the first, then until none has come for a second
// (notifications arrive in commit order, so a second one would come right
// after the first). It returns the count and the error the wait ended
// with (a context's, once one has come).
func notifications(conn *sql.Conn) (got int, err error) {
	err = conn.Raw(func(dc any) error {
		pc := dc.(*stdlib.Conn).Conn()
		for {
			wait := time.Second
			if got == 0 {
				wait = 30 * time.Second
			}
			wctx, cancel := context.WithTimeout(context.Background(), wait)
			_, err := pc.WaitForNotification(wctx)
			cancel()
			if err != nil {
				return err
			}
			got++
		}
	})
	return got, err
}
