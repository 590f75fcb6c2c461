package outbox

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
)

// Close landing between Run's start and its first look at closing (here
// forced: closing is closed first, as Close does before it finds Run
// started): Run returned ErrClosed without closing the relay's scheduler, and
// Close, finding Run done, returned nil: the scheduler and its pool's
// goroutines leaked.
func TestCloseRacingRunStartClosesScheduler(t *testing.T) {
	ctx := context.Background()
	o, err := New(dbtest.SQLite(t))
	require.NoError(t, err)
	r, err := o.NewRelay(func(context.Context, Event) error { return nil })
	require.NoError(t, err)
	r.closeOnce.Do(func() { r.closeCtx = ctx; close(r.closing) }) // Close's first step
	require.ErrorIs(t, r.Run(ctx), ErrClosed)
	require.NoError(t, r.Close(ctx))
	_, err = r.sched.TrySubmit(ctx, "k", func(context.Context) error { return nil })
	require.ErrorIs(t, err, keysched.ErrClosed, "the relay's scheduler is still open")
}
