package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A scheduler option that makes a setting the relay sets itself (its dead
// letter, failure policy, pending and key depth bounds) is refused, naming
// it and the relay option to use instead, where the relay used to override
// it without a word (a keysched.WithDeadLetter never called, a
// keysched.WithFailurePolicy(Park) never parking). Options the relay does
// not set, and keysched.WithRetryPanics (which it sets the same way), are
// accepted.
func TestSchedulerOptionsTheRelaySetsAreRefused(t *testing.T) {
	ob := newOutbox(t, dbtest.SQLite(t))
	sink := func(context.Context, outbox.Event) error { return nil }
	for _, c := range []struct {
		opt           keysched.Option
		name, instead string
	}{
		{keysched.WithDeadLetter(func(keysched.DeadLetter[string]) {}), "keysched.WithDeadLetter", "WithOnDead"},
		{keysched.WithFailurePolicy(keysched.Park), "keysched.WithFailurePolicy", "the relay's WithFailurePolicy"},
		{keysched.WithMaxPending(10), "keysched.WithMaxPending", "WithBatchSize"},
		{keysched.WithMaxKeyDepth(10), "keysched.WithMaxKeyDepth", "WithKeyBatch"},
	} {
		_, err := ob.NewRelay(sink, outbox.WithLogger(quiet),
			outbox.WithSchedulerOptions(keysched.WithTaskAges(), c.opt))
		require.ErrorIs(t, err, outbox.ErrInvalidOption, c.name)
		require.ErrorIs(t, err, keysched.ErrInvalidOption, c.name)
		var oe *keysched.OptionError
		require.True(t, errors.As(err, &oe), c.name)
		require.Equal(t, "WithSchedulerOptions", oe.Option)
		require.Equal(t, c.name, oe.With)
		require.Contains(t, err.Error(), c.name)
		require.Contains(t, err.Error(), c.instead)
		require.Contains(t, err.Error(), "option 1", "the position among the options given")
	}
	r, err := ob.NewRelay(sink, outbox.WithLogger(quiet),
		outbox.WithSchedulerOptions(keysched.WithRetryPanics(), keysched.WithTaskAges(),
			keysched.WithObserver(keysched.Observer[string]{}), keysched.WithMaxConcurrency(2)))
	require.NoError(t, err)
	require.NoError(t, r.Close(context.Background()))
}

// A scheduler option the relay sets itself is refused as such even with a
// value keysched refuses (a nil dead-letter function, a depth of 0): the
// error names the relay option to use, where it said only that the value
// was wrong, so that the caller mended the value to be refused again.
func TestSchedulerOptionsTheRelaySetsAreRefusedWhateverTheirValue(t *testing.T) {
	ob := newOutbox(t, dbtest.SQLite(t))
	sink := func(context.Context, outbox.Event) error { return nil }
	for _, c := range []struct {
		opt           keysched.Option
		name, instead string
	}{
		{keysched.WithDeadLetter[string](nil), "keysched.WithDeadLetter", "WithOnDead"},
		{keysched.WithFailurePolicy(keysched.FailurePolicy(99)), "keysched.WithFailurePolicy", "the relay's WithFailurePolicy"},
		{keysched.WithMaxPending(0), "keysched.WithMaxPending", "WithBatchSize"},
		{keysched.WithMaxKeyDepth(-1), "keysched.WithMaxKeyDepth", "WithKeyBatch"},
	} {
		_, err := ob.NewRelay(sink, outbox.WithLogger(quiet), outbox.WithSchedulerOptions(c.opt))
		require.ErrorIs(t, err, outbox.ErrInvalidOption, c.name)
		require.Contains(t, err.Error(), "which the relay sets itself", c.name)
		require.Contains(t, err.Error(), c.instead, c.name)
	}
}
