package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A Relay's SkipEvent (and Resume, SkipHead, Recover) wakes its relay when
// its move may have taken effect, not only when it is known to have: an
// error wrapping ErrOutcomeUnknown (the statement, or Recover's COMMIT, cut
// short in flight) may come with the row moved, and the move may complete
// on the server after the call returned. Without the wake-ups the key's
// next row waited for the relay's next poll (here a minute: the relay is
// idle, and nothing notifies it of a move). The proxy holds the statement
// 200 ms and the context ends after 100.
func TestRelayMoveWithUnknownOutcomeWakesTheRelay(t *testing.T) {
	srv := dbtest.NewServer(t)
	proxy := srv.LatencyProxy(t, 0)
	// The simple protocol: each statement is one round trip, sent whole.
	db := proxy.Open(t, "default_query_exec_mode=simple_protocol")
	ob := newOutbox(t, db)
	bg := context.Background()
	cutShort := func(f func(ctx context.Context) error) error {
		ctx, cancel := context.WithCancel(bg)
		defer cancel()
		proxy.SetDelay(200 * time.Millisecond)
		defer proxy.SetDelay(0)
		time.AfterFunc(100*time.Millisecond, cancel)
		return f(ctx)
	}
	cases := []struct {
		name string
		move func(r *outbox.Relay, head string) error
		want int // the key's rows published after the move
	}{
		{"SkipEvent", func(r *outbox.Relay, head string) error {
			return cutShort(func(ctx context.Context) error { return r.SkipEvent(ctx, key(0), head) })
		}, 1},
		{"Resume", func(r *outbox.Relay, _ string) error {
			return cutShort(func(ctx context.Context) error { return r.Resume(ctx, key(1)) })
		}, 2},
		{"SkipHead", func(r *outbox.Relay, _ string) error {
			return cutShort(func(ctx context.Context) error { _, err := r.SkipHead(ctx, key(2)); return err })
		}, 1},
		{"Recover", func(r *outbox.Relay, _ string) error {
			// Cut short during its batch's COMMIT.
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			outbox.BeforeRecoverCommit(ob, func() {
				proxy.SetDelay(200 * time.Millisecond)
				time.AfterFunc(100*time.Millisecond, cancel)
			})
			defer outbox.BeforeRecoverCommit(ob, nil)
			defer proxy.SetDelay(0)
			_, err := r.Recover(ctx, outbox.RecoverFilter{Keys: []string{key(3)}})
			return err
		}, 2},
	}
	writeEvents(t, ob, len(cases), 2, 10)
	for i := range cases {
		_, err := db.ExecContext(bg, `UPDATE `+ob.Table()+` SET state = 2 WHERE id = $1`, headIDs(t, ob, key(i))[0])
		require.NoError(t, err)
	}
	rec := newRecorder(0)
	published := func(k string) int {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.byKey[k])
	}
	for i, c := range cases {
		// A relay of its own for each case: a wake-up of an earlier
		// case's (a second after it) goes to that case's relay.
		r, stop := startRelay(t, ob, rec.sink, outbox.WithLogger(quiet), outbox.WithPollInterval(time.Minute),
			outbox.WithFailurePolicy(keysched.Park))
		require.Eventually(t, func() bool { return r.Stats().Polls > 0 && r.Stats().Listening }, 10*time.Second, 5*time.Millisecond,
			"%s: the relay polled (every key parked) and went idle", c.name)
		head := headIDs(t, ob, key(i))[0]
		// A connection open and idle in the pool: the move is sent on
		// it at once (not cut short while connecting).
		require.ErrorIs(t, r.Resume(bg, "none"), outbox.ErrNotParked)
		err := c.move(r, head)
		require.ErrorIs(t, err, outbox.ErrOutcomeUnknown, c.name)
		// The move took effect: the key's rows are published without
		// waiting out the poll interval.
		require.Eventually(t, func() bool { return published(key(i)) == c.want }, 10*time.Second, 5*time.Millisecond,
			"%s: the relay woke and published the key's rows", c.name)
		stop()
	}
}
