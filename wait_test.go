// Completion.Wait outside a task: it returns the task's outcome, or its own
// context's error when that ends first. (Wait inside a task, with the task's
// context, is deadlock_test.go.)

package keysched

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// Wait returns its context's error when the context ends before the task is
// done, and the task is not affected: it runs on, and a later Wait returns
// its outcome.
func TestWaitReturnsItsContextErrorAndLeavesTheTask(t *testing.T) {
	s := newSched[int](t)
	ctx := watchdog(t)
	gate := make(chan struct{})
	c, err := s.Submit(ctx, 1, func(context.Context) error { <-gate; return errFail })
	require.NoError(t, err)
	ended, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, c.Wait(ended), context.Canceled)
	require.NoError(t, c.Err(), "the task is not done")
	close(gate)
	require.ErrorIs(t, c.Wait(ctx), errFail)
}
