package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// SQLite's names are case-insensitive: a schema created by the
// application's own migration from Schema()'s SQL written in upper case
// (CREATE TABLE ORDERS_OUTBOX (SEQ INTEGER ...), CREATE INDEX ... ON
// ORDERS_OUTBOX) is the outbox's own schema, and the statements find it.
// CreateSchema's conflict check took it for another schema: it compared
// the indexes' and triggers' table (stored as written) and the columns
// (stored as written) with the lower-case names, and refused every one of
// them with ErrSchemaConflict.
func TestCreateSchemaAcceptsASQLiteSchemaWrittenInUpperCase(t *testing.T) {
	db := dbtest.SQLite(t)
	ctx := context.Background()
	ob := mustOutbox(t, db, "orders_outbox")
	for _, stmt := range ob.Schema() {
		execSQL(t, db, strings.ToUpper(stmt))
	}
	require.NoError(t, ob.CreateSchema(ctx))
	writeEvents(t, ob, 1, 1, 1)
	n, err := ob.Count(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), n[outbox.Pending])

	in := mustInbox(t, db, "orders_inbox")
	for _, stmt := range in.Schema() {
		execSQL(t, db, strings.ToUpper(stmt))
	}
	require.NoError(t, in.CreateSchema(ctx))
}
