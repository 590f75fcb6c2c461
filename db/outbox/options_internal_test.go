package outbox

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/panjf2000/ants/v2"
	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
)

// The relay's options meet by keysched.Option's rule (see RelayOption): the
// last of a name wins, of two bounds given the outer one applies, a default
// gives way to a bound given. Each row checks what NewRelay settles on.
func TestRelayOptionsMeetByOneRule(t *testing.T) {
	o, err := New(dbtest.SQLite(t))
	require.NoError(t, err)
	noop := func(context.Context, Event) error { return nil }
	quiet := WithLogger(slog.New(slog.DiscardHandler))
	for _, tc := range []struct {
		name            string
		opts            []RelayOption
		batch, keyBatch int
		poll, lease     time.Duration
	}{
		{"defaults", nil, DefaultBatchSize, DefaultKeyBatch, DefaultPollInterval, DefaultLeaseDuration},
		{"the last WithBatchSize wins", []RelayOption{WithBatchSize(10), WithBatchSize(20)}, 20, 20, DefaultPollInterval, DefaultLeaseDuration},
		{"key batch above batch: batch applies", []RelayOption{WithKeyBatch(100), WithBatchSize(10)}, 10, 10, DefaultPollInterval, DefaultLeaseDuration},
		{"key batch alone above the default batch raises it", []RelayOption{WithKeyBatch(DefaultBatchSize + 5)}, DefaultBatchSize + 5, DefaultBatchSize + 5, DefaultPollInterval, DefaultLeaseDuration},
		{"poll above a third of the lease: the lease applies", []RelayOption{WithPollInterval(time.Minute), WithLeaseDuration(3 * time.Second)}, DefaultBatchSize, DefaultKeyBatch, time.Second, 3 * time.Second},
		{"poll alone above a third of the default lease raises it", []RelayOption{WithPollInterval(time.Minute)}, DefaultBatchSize, DefaultKeyBatch, time.Minute, 3 * time.Minute},
		{"a default poll above a third of the lease is lowered", []RelayOption{WithLeaseDuration(300 * time.Millisecond)}, DefaultBatchSize, DefaultKeyBatch, 100 * time.Millisecond, 300 * time.Millisecond},
		{"sink timeout alone above half the default lease raises it", []RelayOption{WithSinkTimeout(time.Minute)}, DefaultBatchSize, DefaultKeyBatch, DefaultPollInterval, 2 * time.Minute},
		{"sink timeout alone within half the default lease leaves it", []RelayOption{WithSinkTimeout(time.Second)}, DefaultBatchSize, DefaultKeyBatch, DefaultPollInterval, DefaultLeaseDuration},
		{"poll and sink timeout alone: the lease grows to the larger need", []RelayOption{WithPollInterval(time.Minute), WithSinkTimeout(2 * time.Minute)}, DefaultBatchSize, DefaultKeyBatch, time.Minute, 4 * time.Minute},
		{"a lease raised by the poll stops at MaxLeaseDuration", []RelayOption{WithPollInterval(1 << 62)}, DefaultBatchSize, DefaultKeyBatch, MaxLeaseDuration / 3, MaxLeaseDuration},
		{"a lease raised by the sink timeout stops at MaxLeaseDuration", []RelayOption{WithSinkTimeout(MaxLeaseDuration / 2)}, DefaultBatchSize, DefaultKeyBatch, DefaultPollInterval, MaxLeaseDuration},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := o.NewRelay(noop, append([]RelayOption{quiet}, tc.opts...)...)
			require.NoError(t, err)
			defer func() { require.NoError(t, r.Close(context.Background())) }()
			require.Equal(t, tc.batch, r.cfg.batch, "batch")
			require.Equal(t, tc.keyBatch, r.cfg.keyBatch, "key batch")
			require.Equal(t, tc.poll, r.cfg.poll, "poll interval")
			require.Equal(t, tc.lease, r.cfg.lease, "lease")
		})
	}

	// The scheduler's options: its refusals keep their *keysched.OptionError;
	// without WithWorkers the default pool gives way to keysched.WithPool.
	p, err := ants.NewPool(2)
	require.NoError(t, err)
	defer p.Release()
	r, err := o.NewRelay(noop, quiet, WithSchedulerOptions(keysched.WithPool(p)))
	require.NoError(t, err, "keysched.WithPool without WithWorkers")
	require.NoError(t, r.Close(context.Background()))
	for _, tc := range []struct {
		opts         []RelayOption
		option, with string
	}{
		{[]RelayOption{WithWorkers(4), WithSchedulerOptions(keysched.WithPool(p))}, "WithWorkers", "WithPool"},
		{[]RelayOption{WithRetry(keysched.RetryPolicy{MaxAttempts: 3})}, "WithRetry", ""},
		{[]RelayOption{WithSchedulerOptions(keysched.WithMaxConcurrency(0))}, "WithMaxConcurrency", ""},
	} {
		_, err := o.NewRelay(noop, append([]RelayOption{quiet}, tc.opts...)...)
		require.ErrorIs(t, err, ErrInvalidOption)
		var oe *keysched.OptionError
		require.True(t, errors.As(err, &oe), "%v", err)
		require.Equal(t, [2]string{tc.option, tc.with}, [2]string{oe.Option, oe.With}, err.Error())
	}
}
