package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/sqldb"
)

// warnText is the text of a slog handler, safe for concurrent use.
type warnText struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *warnText) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *warnText) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), s)
}

func (l *warnText) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// plainSQLite is a SQLite file opened the way a newcomer does, without the
// settings sqldb.OpenSQLite gives: no busy timeout, no WAL, deferred
// transactions.
func plainSQLite(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "plain.db"))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

// On a SQLite file opened without a busy timeout, CreateSchema (once per
// Outbox, on slog.Default) and Relay.Run (on the relay's logger) warn,
// naming sqldb.OpenSQLite, and go on; on a database opened with OpenSQLite,
// or an in-memory one (nothing to wait for), neither warns. Before, all of
// them were silent, and 8 concurrent writers then saw most writes fail
// with SQLITE_BUSY.
func TestSQLiteWithoutBusyTimeoutIsWarnedAbout(t *testing.T) {
	ctx := context.Background()
	var def warnText
	prev := slog.Default()
	slog.SetDefault(def.logger())
	t.Cleanup(func() { slog.SetDefault(prev) })

	const warning = "sqldb.OpenSQLite"
	ob, err := outbox.New(plainSQLite(t))
	require.NoError(t, err)
	require.NoError(t, ob.CreateSchema(ctx))
	require.Equal(t, 1, def.count(warning), "CreateSchema warns")
	require.NoError(t, ob.CreateSchema(ctx))
	require.Equal(t, 1, def.count(warning), "once per Outbox")
	runOnce := func(ob *outbox.Outbox) int {
		writeOne(t, ob, "k") // before the relay: a plain SQLite has no busy timeout
		var l warnText
		published := make(chan struct{}, 1)
		_, stop := startRelay(t, ob, func(context.Context, outbox.Event) error {
			published <- struct{}{}
			return nil
		}, outbox.WithLogger(l.logger()), outbox.WithPollInterval(10*time.Millisecond))
		defer stop()
		select {
		case <-published: // Run is past its start
		case <-time.After(30 * time.Second):
			t.Fatal("nothing published")
		}
		return l.count(warning)
	}
	require.Equal(t, 1, runOnce(ob), "Run warns")

	memory, err := sql.Open("sqlite", ":memory:")
	require.NoError(t, err)
	t.Cleanup(func() { memory.Close() })
	memory.SetMaxOpenConns(1) // one connection: one database
	for _, db := range []*sql.DB{dbtest.SQLite(t), memory} {
		ob, err := outbox.New(db)
		require.NoError(t, err)
		require.NoError(t, ob.CreateSchema(ctx))
		require.Zero(t, runOnce(ob))
	}
	require.Equal(t, 1, def.count(warning))
}

// A Write that meets another writer's lock on a SQLite file without a busy
// timeout fails with SQLITE_BUSY (a conflict, by sqldb.Classify) whose text
// says what to do: open the database with sqldb.OpenSQLite.
func TestWriteBusyWithoutBusyTimeoutSaysWhatToDo(t *testing.T) {
	ctx := context.Background()
	db := plainSQLite(t)
	ob, err := outbox.New(db, outbox.WithTable("busy"))
	require.NoError(t, err)
	require.NoError(t, ob.CreateSchema(ctx))
	first, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer first.Rollback()
	_, err = ob.Write(ctx, first, outbox.Event{Key: "k"}) // takes the write lock
	require.NoError(t, err)
	second, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer second.Rollback()
	_, err = ob.Write(ctx, second, outbox.Event{Key: "k"})
	require.Error(t, err)
	require.Equal(t, sqldb.KindConflict, sqldb.Classify(err), "%v", err)
	require.ErrorContains(t, err, "busy_timeout")
	require.ErrorContains(t, err, "sqldb.OpenSQLite")
}
