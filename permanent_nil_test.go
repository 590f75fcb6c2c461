package keysched

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// Permanent(nil) is nil (as Snooze(nil, d) is): a task returning it
// succeeded, and leaves no dead letter.
func TestPermanentOfNilIsSuccess(t *testing.T) {
	require.NoError(t, Permanent(nil))
	var dl recorder[string]
	s := newSched[string](t, WithDeadLetter(dl.fn))
	ctx := watchdog(t)
	c, err := s.Submit(ctx, "k", func(context.Context) error { return Permanent(nil) })
	require.NoError(t, err)
	require.NoError(t, c.Wait(ctx))
	require.NoError(t, s.Drain(ctx))
	require.Equal(t, uint64(1), s.Stats().Succeeded)
	require.Empty(t, dl.all())
}
