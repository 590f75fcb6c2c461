package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// audit is a side table a MarkHook writes one row per marked outbox row to.
type audit struct {
	db    *sql.DB
	table string
	ins   string

	mu    sync.Mutex
	seen  []outbox.Marked // every row handed to the hook, failed calls included
	calls int             // hook calls
	after atomic.Int32    // rows whose AfterMarkCommit function ran
	fail  atomic.Bool     // the hook fails (after its inserts) while set
}

func newAudit(t *testing.T, ob *outbox.Outbox) *audit {
	t.Helper()
	a := &audit{db: ob.DB(), table: dbtest.Table(t, ob.DB(), "audit")}
	_, err := a.db.ExecContext(context.Background(), `CREATE TABLE `+a.table+` (id TEXT NOT NULL, state INTEGER NOT NULL, note TEXT NOT NULL)`)
	require.NoError(t, err)
	a.ins = `INSERT INTO ` + a.table + ` (id, state, note) VALUES (?, ?, ?)`
	if ob.Dialect() == outbox.Postgres {
		a.ins = `INSERT INTO ` + a.table + ` (id, state, note) VALUES ($1, $2, $3)`
	}
	return a
}

func (a *audit) hook(ctx context.Context, tx *sql.Tx, marked []outbox.Marked) error {
	a.mu.Lock()
	a.calls++
	a.seen = append(a.seen, marked...)
	a.mu.Unlock()
	for _, m := range marked {
		note, _ := m.Note.(string)
		if _, err := tx.ExecContext(ctx, a.ins, m.Event.ID, int(m.State), note); err != nil {
			return err
		}
	}
	if a.fail.Load() {
		return errors.New("injected hook failure")
	}
	n := int32(len(marked))
	if !outbox.AfterMarkCommit(ctx, func() { a.after.Add(n) }) {
		return errors.New("AfterMarkCommit refused the hook's context")
	}
	return nil
}

// rows returns the audit table's id -> states written.
func (a *audit) rows(t *testing.T) map[string][]outbox.State {
	t.Helper()
	rows, err := a.db.QueryContext(context.Background(), `SELECT id, state, note FROM `+a.table)
	require.NoError(t, err)
	defer rows.Close()
	m := map[string][]outbox.State{}
	for rows.Next() {
		var id, note string
		var st int
		require.NoError(t, rows.Scan(&id, &st, &note))
		require.Equal(t, "note of "+id, note, "the sink's SetMarkNote reaches the hook")
		m[id] = append(m[id], outbox.State(st))
	}
	require.NoError(t, rows.Err())
	return m
}

func (a *audit) snapshot() (calls int, seen []outbox.Marked) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls, append([]outbox.Marked(nil), a.seen...)
}

// A MarkHook's error rolls its mark transaction back: the rows stay
// pending, the hook's writes are undone, its AfterMarkCommit functions do
// not run, and the relay marks again (hook included) every poll interval
// without publishing the rows again. Once the hook succeeds, each row is
// marked once, its audit row written once, in the same transaction.
func TestMarkHookErrorLeavesRowsPendingAndUndoesItsWrites(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		const keys, perKey = 2, 3
		ob := newOutbox(t, db)
		a := newAudit(t, ob)
		a.fail.Store(true)
		writeEvents(t, ob, keys, perKey, 2)
		var mu sync.Mutex
		calls := map[string]int{}
		r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
			mu.Lock()
			calls[e.ID]++
			mu.Unlock()
			if !outbox.SetMarkNote(ctx, "note of "+e.ID) {
				return errors.New("SetMarkNote refused the sink's context")
			}
			return nil
		}, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond),
			outbox.WithRetention(time.Hour), outbox.WithMarkHook(a.hook))
		require.NoError(t, err)
		runRelay(t, r)
		require.Eventually(t, func() bool {
			// A failure is counted once its transaction has rolled back.
			return r.Stats().Published == keys*perKey && r.Stats().DBErrors >= 3
		}, 30*time.Second, time.Millisecond, "published, then the hook failed three times, each counted as a failed mark")
		require.Equal(t, map[outbox.State]int64{outbox.Pending: keys * perKey}, counts(t, ob))
		require.Empty(t, a.rows(t), "the failing hook's writes rolled back")
		require.Zero(t, a.after.Load(), "no AfterMarkCommit function ran")
		require.Zero(t, r.Stats().Marked)
		hookCalls, _ := a.snapshot()
		require.GreaterOrEqual(t, hookCalls, 3)

		a.fail.Store(false)
		require.Eventually(t, func() bool { return counts(t, ob)[outbox.Sent] == keys*perKey }, 30*time.Second, time.Millisecond)
		require.Eventually(t, func() bool { return a.after.Load() == keys*perKey }, 30*time.Second, time.Millisecond,
			"AfterMarkCommit runs once per committed mark")
		got := a.rows(t)
		require.Len(t, got, keys*perKey)
		for id, states := range got {
			require.Equal(t, []outbox.State{outbox.Sent}, states, id)
		}
		mu.Lock()
		for id, n := range calls {
			require.Equal(t, 1, n, "%s: marked again, not published again", id)
		}
		mu.Unlock()
		_, seen := a.snapshot()
		for _, m := range seen {
			require.Equal(t, outbox.Sent, m.State)
			require.Equal(t, m.Event.Key, m.Claim.Key)
			require.Equal(t, r.Token(), m.Claim.Token)
			require.Equal(t, r.Owner(), m.Claim.Owner)
			require.GreaterOrEqual(t, m.Claim.Epoch, int64(1))
		}
	})
}

// The hook gets only the rows its transaction marked: a row on a key whose
// lease another relay took while the row was published (sent or failed for
// good) is not marked, and the hook never sees it; a row of a key still
// held is marked and seen, sent or dead.
func TestMarkHookSeesOnlyRowsMarkedUnderItsClaim(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   error
		state outbox.State
	}{{"sent", nil, outbox.Sent}, {"dead", keysched.Permanent(errors.New("rejected")), outbox.Dead}} {
		t.Run(tc.name, func(t *testing.T) {
			dbtest.Each(t, func(t *testing.T, db *sql.DB) {
				ob := newOutbox(t, db)
				a := newAudit(t, ob)
				writeEvents(t, ob, 2, 1, 2) // key(0): taken over during its call; key(1): kept
				ids := map[string]string{}
				var mu sync.Mutex
				r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
					mu.Lock()
					ids[e.Key] = e.ID
					mu.Unlock()
					outbox.SetMarkNote(ctx, "note of "+e.ID)
					if e.Key == key(0) {
						if err := stealLease(ob, e.Key); err != nil {
							t.Error(err)
						}
					}
					return tc.err
				}, outbox.WithLogger(quiet), outbox.WithOwner("svc-1"), outbox.WithPollInterval(5*time.Millisecond),
					outbox.WithLeaseDuration(time.Hour), outbox.WithRetention(time.Hour),
					outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 1}), outbox.WithMarkHook(a.hook))
				require.NoError(t, err)
				stop := runRelay(t, r)
				require.Eventually(t, func() bool {
					st := r.Stats()
					return st.LeasesLost == 1 && st.Marked+st.Dead == 1
				}, 30*time.Second, time.Millisecond)
				waitPolls(t, r, 3)
				stop()
				mu.Lock()
				defer mu.Unlock()
				_, seen := a.snapshot()
				require.Len(t, seen, 1, "the hook saw only the row marked under its claim")
				require.Equal(t, ids[key(1)], seen[0].Event.ID)
				require.Equal(t, tc.state, seen[0].State)
				if tc.state == outbox.Dead {
					require.Equal(t, 1, seen[0].Attempts)
					require.Contains(t, seen[0].Err, "rejected")
				}
				require.Equal(t, map[string][]outbox.State{ids[key(1)]: {tc.state}}, a.rows(t))
				require.Equal(t, map[outbox.State]int64{outbox.Pending: 1, tc.state: 1}, counts(t, ob), "the taken-over key's row stays pending")
			})
		})
	}
}

// A hook error on a dead mark leaves the row pending (not dead, nothing of
// the hook's written); the key is claimed afresh, the row fails again and
// its dead mark, hook included, commits.
func TestMarkHookErrorOnDeadMarkLeavesRowPending(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ob := newOutbox(t, db)
		a := newAudit(t, ob)
		a.fail.Store(true)
		writeEvents(t, ob, 1, 1, 1)
		var calls atomic.Int32
		r, err := ob.NewRelay(func(ctx context.Context, e outbox.Event) error {
			if calls.Add(1) == 2 {
				a.fail.Store(false) // the first dead mark's hook failed; the next succeeds
			}
			outbox.SetMarkNote(ctx, "note of "+e.ID)
			return keysched.Permanent(errors.New("rejected"))
		}, outbox.WithLogger(quiet), outbox.WithPollInterval(5*time.Millisecond),
			outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 1}), outbox.WithMarkHook(a.hook))
		require.NoError(t, err)
		runRelay(t, r)
		require.Eventually(t, func() bool { return r.Stats().Dead == 1 }, 30*time.Second, time.Millisecond)
		require.GreaterOrEqual(t, calls.Load(), int32(2), "published again after the failed dead mark")
		hookCalls, _ := a.snapshot()
		require.GreaterOrEqual(t, hookCalls, 2)
		require.Equal(t, map[outbox.State]int64{outbox.Dead: 1}, counts(t, ob))
		got := a.rows(t)
		require.Len(t, got, 1)
		for _, states := range got {
			require.Equal(t, []outbox.State{outbox.Dead}, states, "written once: the failed hook's insert rolled back")
		}
		require.EqualValues(t, 1, a.after.Load())
	})
}

// WithMarkHook(nil) is an invalid option; SetMarkNote and AfterMarkCommit
// refuse a context that is not a sink call's or a hook's.
func TestMarkHookNilAndForeignContexts(t *testing.T) {
	ob, err := outbox.New(dbtest.SQLite(t))
	require.NoError(t, err)
	_, err = ob.NewRelay(func(context.Context, outbox.Event) error { return nil }, outbox.WithMarkHook(nil))
	require.ErrorIs(t, err, outbox.ErrInvalidOption)
	require.True(t, strings.Contains(err.Error(), "WithMarkHook"), err)
	require.False(t, outbox.SetMarkNote(context.Background(), 1))
	require.False(t, outbox.SetMarkNote(nil, 1)) //nolint:staticcheck // a nil context is refused
	ran := false
	require.False(t, outbox.AfterMarkCommit(context.Background(), func() { ran = true }))
	require.False(t, outbox.AfterMarkCommit(nil, func() { ran = true })) //nolint:staticcheck // a nil context is refused
	require.False(t, ran)
}
