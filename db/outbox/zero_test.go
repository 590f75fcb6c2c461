package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/internal/zerotest"
)

// TestZeroValues calls every exported method of a nil and a zero handle (not
// made by its constructor): each error result is the type's ErrZero...
// sentinel, each other result the zero value, and nothing panics or hangs.
// A method added to a type and not to its list here fails the test.
func TestZeroValues(t *testing.T) {
	for _, c := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"Outbox", func(t *testing.T) {
			zerotest.Check[outbox.Outbox](t, outbox.ErrZeroOutbox, []string{
				"Count", "CreateSchema", "DB", "Dead", "Dialect", "Lookup", "NewRelay",
				"Parked", "Recover", "Recoverable", "Resume", "Schema", "Skip", "SkipEvent", "SkipHead", "Table", "Write",
			})
		}},
		{"Relay", func(t *testing.T) {
			zerotest.Check[outbox.Relay](t, outbox.ErrZeroRelay, []string{
				"Close", "Owner", "Parked", "Recover", "Resume", "Run", "Scheduler", "Skip", "SkipEvent", "SkipHead", "Stats", "Token",
			})
		}},
	} {
		t.Run(c.name, c.run)
	}
}

// A nil context is keysched.ErrNilContext, not a panic inside database/sql
// (Write's panic left the caller's transaction open).
func TestNilContext(t *testing.T) {
	ctx := context.Background()
	db := dbtest.SQLite(t)
	ob := newOutbox(t, db)
	var nilCtx context.Context
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	calls := map[string]func() error{
		"CreateSchema": func() error { return ob.CreateSchema(nilCtx) },
		"Write":        func() error { _, err := ob.Write(nilCtx, tx, outbox.Event{Key: "k"}); return err },
		"Dead":         func() error { _, err := ob.Dead(nilCtx, 1); return err },
		"Parked":       func() error { _, err := ob.Parked(nilCtx); return err },
		"Resume":       func() error { return ob.Resume(nilCtx, "k") },
		"Skip":         func() error { return ob.Skip(nilCtx, "k") },
		"SkipEvent":    func() error { return ob.SkipEvent(nilCtx, "k", "id") },
		"Count":        func() error { _, err := ob.Count(nilCtx); return err },
		"Lookup":       func() error { _, err := ob.Lookup(nilCtx, "id"); return err },
	}
	for name, call := range calls {
		var err error
		require.NotPanics(t, func() { err = call() }, name)
		require.ErrorIs(t, err, keysched.ErrNilContext, name)
	}
}
