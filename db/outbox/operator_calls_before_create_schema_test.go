package outbox_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// An operator's call on an outbox whose table is missing (CreateSchema not
// run, or run on another database) says so and to run CreateSchema
// (ErrNoSchema, naming the table), as Run, Write and Lookup do, on both
// databases: Resume, Skip, SkipHead, SkipEvent, Dead, Parked, Count,
// Recover and Recoverable returned the database's raw "no such table" /
// "relation does not exist".
func TestOperatorCallsBeforeCreateSchemaSaySo(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		table := dbtest.Table(t, db, "noschema")
		ob, err := outbox.New(db, outbox.WithTable(table))
		require.NoError(t, err)
		calls := map[string]func() error{
			"Resume":    func() error { return ob.Resume(ctx, "k") },
			"Skip":      func() error { return ob.Skip(ctx, "k") },
			"SkipHead":  func() error { _, err := ob.SkipHead(ctx, "k"); return err },
			"SkipEvent": func() error { return ob.SkipEvent(ctx, "k", "e1") },
			"Dead":      func() error { _, err := ob.Dead(ctx, 10); return err },
			"Parked":    func() error { _, err := ob.Parked(ctx); return err },
			"Count":     func() error { _, err := ob.Count(ctx); return err },
			"Recover":   func() error { _, err := ob.Recover(ctx, outbox.RecoverFilter{}); return err },
			"Recoverable": func() error {
				_, err := ob.Recoverable(ctx, outbox.RecoverFilter{})
				return err
			},
		}
		for name, call := range calls {
			err := call()
			require.ErrorIs(t, err, outbox.ErrNoSchema, name)
			require.ErrorContains(t, err, table, name)
		}
	})
}
