package keysched

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Snooze(nil, d) is nil for every d, negative included (as Permanent(nil)
// is): a task returning it succeeded, runs once, is not snoozed and leaves no
// dead letter, with or without a retry policy.
func TestSnoozeOfNilIsSuccessForAnyDelay(t *testing.T) {
	for _, d := range []time.Duration{-time.Hour, -1, 0, time.Nanosecond, time.Hour} {
		for _, retry := range []bool{false, true} {
			var dl recorder[string]
			opts := []Option{WithLogger(quiet), WithDeadLetter(dl.fn)}
			if retry {
				opts = append(opts, WithRetry(RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Hour}))
			}
			s, err := New[string](opts...)
			require.NoError(t, err)
			t.Cleanup(func() {
				if t.Failed() {
					_ = abortClose(s) // a task snoozed for ever
				}
			})
			// A bound far above any normal run, not a timing assertion: a
			// Snooze(nil, d) taken for a snooze fails here by name.
			ctx := hangGuard(t, 10*time.Second)
			runs := 0
			c, err := s.Submit(ctx, "k", func(context.Context) error {
				runs++
				return Snooze(nil, d)
			})
			require.NoError(t, err)
			require.NoError(t, c.Wait(ctx), "d %v", d)
			require.NoError(t, s.Close(ctx))
			require.Equal(t, 1, runs, "d %v", d)
			st := s.Stats()
			require.Equal(t, uint64(1), st.Succeeded, "d %v", d)
			require.Zero(t, st.Snoozed, "d %v", d)
			require.Empty(t, dl.all(), "d %v", d)
		}
	}
}
