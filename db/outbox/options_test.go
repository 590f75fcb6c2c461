package outbox_test

import (
	"context"
	"database/sql"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/internal/opttest"
)

// WithSchedulerOptions reaches the relay's scheduler: an observer sees every
// sink call, WithTaskAges makes OldestAge report a blocked row's age. A row
// failing for good is marked dead in the database and its key goes on (the
// scheduler options the relay sets itself are refused: see
// TestSchedulerOptionsTheRelaySetsAreRefused).
func TestSchedulerOptions(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		const keys, perKey = 3, 3
		writeEvents(t, ob, keys, perKey, 10)
		var ended, calls atomic.Int64
		obs := keysched.Observer[string]{AttemptEnded: func(string, keysched.AttemptInfo) { ended.Add(1) }}
		blocked, release := make(chan struct{}), make(chan struct{})
		rec := newRecorder(keys*perKey - 1)
		r, stop := startRelay(t, ob, func(ctx context.Context, e outbox.Event) error {
			calls.Add(1)
			switch {
			case e.Key == key(0) && string(e.Payload) == "0":
				return keysched.Permanent(errDown)
			case e.Key == key(1) && string(e.Payload) == "0":
				close(blocked)
				<-release
			}
			return rec.sink(ctx, e)
		}, outbox.WithLogger(quiet), outbox.WithPollInterval(10*time.Millisecond),
			outbox.WithSchedulerOptions(keysched.WithObserver(obs), keysched.WithTaskAges()),
			outbox.WithSchedulerOptions(keysched.WithRetryPanics()))
		<-blocked
		require.Positive(t, r.Scheduler().OldestAge(), "a row waits in its sink: its age is reported")
		close(release)
		rec.wait(t, 30*time.Second)
		stop()
		require.Equal(t, map[string][]int{key(0): {1, 2}, key(1): {0, 1, 2}, key(2): {0, 1, 2}}, rec.byKey,
			"in order; the dead row's key went on")
		require.Equal(t, calls.Load(), ended.Load(), "the observer saw every sink call")
		dead, err := ob.Dead(context.Background(), 10)
		require.NoError(t, err)
		require.Len(t, dead, 1)
		require.Equal(t, key(0), dead[0].Key)
		require.Contains(t, dead[0].Err, errDown.Error())
	})
}

func TestSchedulerOptionsErrors(t *testing.T) {
	db := dbtest.SQLite(t)
	ob := newOutbox(t, db)
	sink := func(context.Context, outbox.Event) error { return nil }
	_, err := ob.NewRelay(sink, outbox.WithSchedulerOptions(nil))
	require.ErrorIs(t, err, outbox.ErrInvalidOption)
	_, err = ob.NewRelay(sink, outbox.WithSchedulerOptions(keysched.WithMaxConcurrency(0)))
	require.ErrorIs(t, err, outbox.ErrInvalidOption)
	require.ErrorIs(t, err, keysched.ErrInvalidOption)
}

// A lease so long that the relay's deadline (monotonic nanoseconds plus the
// lease) overflowed made every row's lease look ended: the relay gave every
// row back, published nothing and reported no error. It is now refused, and
// the longest lease allowed publishes.
func TestLeaseDurationBounds(t *testing.T) {
	db := dbtest.SQLite(t)
	ob := newOutbox(t, db)
	_, err := ob.NewRelay(func(context.Context, outbox.Event) error { return nil }, outbox.WithLeaseDuration(time.Duration(math.MaxInt64)))
	require.ErrorIs(t, err, outbox.ErrInvalidOption)
	writeEvents(t, ob, 2, 3, 10)
	rec := newRecorder(6)
	startRelay(t, ob, rec.sink, outbox.WithLogger(quiet), outbox.WithLeaseDuration(outbox.MaxLeaseDuration))
	rec.wait(t, 30*time.Second)
}

// Each option New or NewRelay refuses is a *keysched.OptionError naming it
// (and, for two that cannot both hold, the other: With), as every keysched
// module's refused option is: errors.As finds it, errors.Is matches
// outbox.ErrInvalidOption and keysched.ErrInvalidOption, and the text
// begins "outbox: invalid option: Name".
func TestRefusedOptionIsAnOptionErrorNamingIt(t *testing.T) {
	db := dbtest.SQLite(t)
	check := func(t *testing.T, err error, option, with string) {
		t.Helper()
		require.Empty(t, opttest.Problem(err, opttest.Want{Option: option, With: with,
			Prefix: "outbox: invalid option: ", Sentinels: []error{outbox.ErrInvalidOption}}))
	}
	for _, tc := range []struct {
		opts   []outbox.Option
		option string
	}{
		{[]outbox.Option{outbox.WithDialect(outbox.Dialect(9))}, "WithDialect"},
		{[]outbox.Option{outbox.WithTable("Robert'); DROP TABLE x;--")}, "WithTable"},
		{[]outbox.Option{outbox.WithNotify(false), nil}, "opts[1]"},
	} {
		ob, err := outbox.New(db, tc.opts...)
		require.Nil(t, ob)
		check(t, err, tc.option, "")
	}

	ob := newOutbox(t, db)
	sink := func(context.Context, outbox.Event) error { return nil }
	for _, tc := range []struct {
		opts         []outbox.RelayOption
		option, with string
	}{
		{[]outbox.RelayOption{outbox.WithFailurePolicy(7)}, "WithFailurePolicy", ""},
		{[]outbox.RelayOption{outbox.WithWorkers(0)}, "WithWorkers", ""},
		{[]outbox.RelayOption{outbox.WithWorkers(math.MaxInt32 + 1)}, "WithWorkers", ""},
		{[]outbox.RelayOption{outbox.WithSinkTimeout(0)}, "WithSinkTimeout", ""},
		{[]outbox.RelayOption{outbox.WithBatchSize(0)}, "WithBatchSize", ""},
		{[]outbox.RelayOption{outbox.WithKeyBatch(-1)}, "WithKeyBatch", ""},
		{[]outbox.RelayOption{outbox.WithMaxKeys(0)}, "WithMaxKeys", ""},
		{[]outbox.RelayOption{outbox.WithPollInterval(0)}, "WithPollInterval", ""},
		{[]outbox.RelayOption{outbox.WithLeaseDuration(time.Millisecond)}, "WithLeaseDuration", ""},
		{[]outbox.RelayOption{outbox.WithLeaseDuration(outbox.MaxLeaseDuration + 1)}, "WithLeaseDuration", ""},
		{[]outbox.RelayOption{outbox.WithRetention(-1)}, "WithRetention", ""},
		{[]outbox.RelayOption{outbox.WithLogger(nil)}, "WithLogger", ""},
		{[]outbox.RelayOption{outbox.WithOwner("")}, "WithOwner", ""},
		{[]outbox.RelayOption{outbox.WithOwner(strings.Repeat("x", 257))}, "WithOwner", ""},
		{[]outbox.RelayOption{outbox.WithMaxOutage(0)}, "WithMaxOutage", ""},
		{[]outbox.RelayOption{outbox.WithOnDead(nil)}, "WithOnDead", ""},
		{[]outbox.RelayOption{outbox.WithMarkHook(nil)}, "WithMarkHook", ""},
		{[]outbox.RelayOption{outbox.WithSchedulerOptions(nil)}, "WithSchedulerOptions", ""},
		{[]outbox.RelayOption{outbox.WithLogger(quiet), nil}, "opts[1]", ""},
		{[]outbox.RelayOption{outbox.WithTakeOverOnStart()}, "WithTakeOverOnStart", "WithOwner"},
		// A sink call's context ends with its key's lease: a timeout above
		// half the lease would not be reached.
		{[]outbox.RelayOption{outbox.WithSinkTimeout(time.Minute), outbox.WithLeaseDuration(time.Second)}, "WithSinkTimeout", "WithLeaseDuration"},
		{[]outbox.RelayOption{outbox.WithLeaseDuration(10 * time.Second), outbox.WithSinkTimeout(5*time.Second + 1)}, "WithSinkTimeout", "WithLeaseDuration"},
		// Without WithLeaseDuration the lease grows to twice the timeout,
		// up to MaxLeaseDuration.
		{[]outbox.RelayOption{outbox.WithSinkTimeout(outbox.MaxLeaseDuration/2 + 1)}, "WithSinkTimeout", ""},
	} {
		r, err := ob.NewRelay(sink, tc.opts...)
		require.Nil(t, r)
		check(t, err, tc.option, tc.with)
	}
	// At half the lease the timeout is reached first: accepted.
	r, err := ob.NewRelay(sink, outbox.WithLogger(quiet), outbox.WithLeaseDuration(10*time.Second), outbox.WithSinkTimeout(5*time.Second))
	require.NoError(t, err)
	require.NoError(t, r.Close(context.Background()))
}
