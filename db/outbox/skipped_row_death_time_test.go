package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A skipped row keeps the time it was marked dead: Recover's DiedAt and its
// Died range are that time, not the skip's (the doc said "or skipped", but
// Skip never changed it).
func TestSkippedRowKeepsItsDeathTime(t *testing.T) {
	ctx := context.Background()
	ob := newOutbox(t, dbtest.SQLite(t))
	writeEvents(t, ob, 1, 1, 1)
	died := make(chan outbox.DeadEvent, 1)
	_, stop := startRelay(t, ob, func(context.Context, outbox.Event) error { return keysched.Permanent(errors.New("no")) },
		outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond), outbox.WithOnDead(func(d outbox.DeadEvent) { died <- d }))
	select {
	case <-died:
	case <-time.After(10 * time.Second):
		t.Fatal("not dead")
	}
	stop()
	dead, err := ob.Dead(ctx, 1)
	require.NoError(t, err)
	time.Sleep(5 * time.Millisecond)
	skippedAt := time.Now()
	require.NoError(t, ob.Skip(ctx, key(0)))
	rows, err := ob.Recoverable(ctx, outbox.RecoverFilter{States: []outbox.State{outbox.Skipped}})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.True(t, rows[0].DiedAt.Equal(dead[0].DiedAt), "DiedAt %v, died at %v", rows[0].DiedAt, dead[0].DiedAt)
	rows, err = ob.Recoverable(ctx, outbox.RecoverFilter{States: []outbox.State{outbox.Skipped}, DiedFrom: skippedAt})
	require.NoError(t, err)
	require.Empty(t, rows, "the skip's time is not the row's")
}
