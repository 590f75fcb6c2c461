package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/keysched/keysched/db/inbox"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/sqldb"
)

func TestMain(m *testing.M) {
	if dsn := os.Getenv("INBOX_CRASH_DSN"); dsn != "" {
		crashChild(dsn)
	}
	dbtest.AnnounceOptOut()
	goleak.VerifyTestMain(m, dbtest.LeakOptions()...)
}

// setup makes an inbox on a fresh table and an effects table (id, n): the
// effect of event e adds 1 to row e.
func setup(t *testing.T, db *sql.DB) (*inbox.Inbox, string) {
	t.Helper()
	ctx := context.Background()
	in, err := inbox.New(db, inbox.WithTable(dbtest.Table(t, db, "ib")))
	require.NoError(t, err)
	require.NoError(t, in.CreateSchema(ctx))
	effects := dbtest.Table(t, db, "fx")
	_, err = db.ExecContext(ctx, `CREATE TABLE `+effects+` (id TEXT PRIMARY KEY, n INTEGER NOT NULL)`)
	require.NoError(t, err)
	return in, effects
}

func effect(ctx context.Context, db *sql.DB, effects, id string) func(tx *sql.Tx) error {
	d, _ := sqldb.Detect(db)
	q := sqldb.Rebind(d, `INSERT INTO `+effects+` (id, n) VALUES (?, 1) ON CONFLICT (id) DO UPDATE SET n = `+effects+`.n + 1`)
	return func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, q, id)
		return err
	}
}

func applied(t *testing.T, db *sql.DB, effects, id string) int {
	t.Helper()
	d, _ := sqldb.Detect(db)
	var n int
	err := db.QueryRow(sqldb.Rebind(d, `SELECT n FROM `+effects+` WHERE id = ?`), id).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0
	}
	require.NoError(t, err)
	return n
}

// The same event delivered three times at once is applied once; the other
// deliveries get "already handled", not an error.
func TestApplyConcurrentDuplicates(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		in, effects := setup(t, db)
		for round := 0; round < 5; round++ {
			id := "evt-" + string(rune('a'+round))
			var wg sync.WaitGroup
			results := make(chan bool, 3)
			start := make(chan struct{})
			for range 3 {
				wg.Go(func() {
					<-start
					ok, err := in.Apply(ctx, id, effect(ctx, db, effects, id))
					require.NoError(t, err)
					results <- ok
				})
			}
			close(start)
			wg.Wait()
			close(results)
			n := 0
			for ok := range results {
				if ok {
					n++
				}
			}
			require.Equal(t, 1, n, "exactly one delivery applies")
			require.Equal(t, 1, applied(t, db, effects, id))
		}
	})
}

// A crash before the commit (the effect's transaction never commits)
// records nothing: the redelivery applies. A crash after the commit (the
// consumer died before acknowledging) makes the redelivery a no-op.
func TestApplyAfterCrash(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		in, effects := setup(t, db)

		// Crash mid-transaction: the process dies inside the effect; its
		// context ends and the transaction is rolled back.
		cctx, crash := context.WithCancel(ctx)
		ok, err := in.Apply(cctx, "e1", func(tx *sql.Tx) error {
			if err := effect(cctx, db, effects, "e1")(tx); err != nil {
				return err
			}
			crash()
			return cctx.Err()
		})
		require.False(t, ok)
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, 0, applied(t, db, effects, "e1"))
		seen, err := in.Seen(ctx, "e1")
		require.NoError(t, err)
		require.False(t, seen)

		// Redelivery after the crash applies once.
		ok, err = in.Apply(ctx, "e1", effect(ctx, db, effects, "e1"))
		require.NoError(t, err)
		require.True(t, ok)
		// The consumer dies before acknowledging: the event comes again,
		// now through a fresh connection pool, as after a restart.
		ok, err = in.Apply(ctx, "e1", effect(ctx, db, effects, "e1"))
		require.NoError(t, err)
		require.False(t, ok, "already handled")
		require.Equal(t, 1, applied(t, db, effects, "e1"))

		// An effect that fails records nothing and its error comes back
		// unwrapped; a panic rolls back and is re-raised.
		boom := errors.New("boom")
		ok, err = in.Apply(ctx, "e2", func(tx *sql.Tx) error { _ = effect(ctx, db, effects, "e2")(tx); return boom })
		require.False(t, ok)
		require.Equal(t, boom, err)
		require.Panics(t, func() {
			_, _ = in.Apply(ctx, "e2", func(tx *sql.Tx) error { _ = effect(ctx, db, effects, "e2")(tx); panic("handler bug") })
		})
		require.Equal(t, 0, applied(t, db, effects, "e2"))
		ok, err = in.Apply(ctx, "e2", effect(ctx, db, effects, "e2"))
		require.NoError(t, err)
		require.True(t, ok)
	})
}

// A real process crash: a child process records the event and runs its
// effect in a transaction, then exits without committing. The database
// (SQLite's journal, PostgreSQL's server) rolls the transaction back; the
// redeliveries after the "restart" apply exactly once.
func TestApplyAfterProcessCrash(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		in, effects := setup(t, db)
		dsn := dbtest.DSN()
		if d, _ := sqldb.Detect(db); d == sqldb.SQLite {
			// Point the child at this test's file.
			var file string
			require.NoError(t, db.QueryRow(`SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&file))
			dsn = "sqlite:" + file
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "INBOX_CRASH_DSN="+dsn, "INBOX_CRASH_TABLE="+tableOf(in), "INBOX_CRASH_EFFECTS="+effects)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "child: %s", out)
		require.Equal(t, 3, exit.ExitCode(), "child: %s", out)

		for i, want := range []bool{true, false, false} {
			ok, err := in.Apply(ctx, "e1", effect(ctx, db, effects, "e1"))
			require.NoError(t, err)
			require.Equal(t, want, ok, "delivery %d", i)
		}
		require.Equal(t, 1, applied(t, db, effects, "e1"))
	})
}

// crashChild is the child process of TestApplyAfterProcessCrash.
func crashChild(dsn string) {
	ctx := context.Background()
	var db *sql.DB
	var err error
	if file, ok := strings.CutPrefix(dsn, "sqlite:"); ok {
		db, err = sqldb.OpenSQLite(file)
	} else {
		db, err = sqldb.OpenPostgres(ctx, dsn)
	}
	if err != nil {
		panic(err)
	}
	in, err := inbox.New(db, inbox.WithTable(os.Getenv("INBOX_CRASH_TABLE")))
	if err != nil {
		panic(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	if first, err := in.Record(ctx, tx, "e1"); err != nil || !first {
		panic(fmt.Sprint(first, err))
	}
	if err := effect(ctx, db, os.Getenv("INBOX_CRASH_EFFECTS"), "e1")(tx); err != nil {
		panic(err)
	}
	os.Exit(3) // crash with the transaction open
}

func tableOf(in *inbox.Inbox) string {
	s := in.Schema()[0]
	f := strings.Fields(s)
	return f[5] // CREATE TABLE IF NOT EXISTS <name> (...
}

// Retention: Cleanup deletes old IDs only when a retention is set; an ID
// deleted that way is applied again if redelivered (the documented risk).
func TestRetention(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		table := dbtest.Table(t, db, "ibr")
		keep, err := inbox.New(db, inbox.WithTable(table))
		require.NoError(t, err)
		require.NoError(t, keep.CreateSchema(ctx))
		ok, err := keep.Apply(ctx, "old", func(*sql.Tx) error { return nil })
		require.NoError(t, err)
		require.True(t, ok)
		n, err := keep.Cleanup(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "no retention: nothing deleted")

		short, err := inbox.New(db, inbox.WithTable(table), inbox.WithRetention(time.Microsecond))
		require.NoError(t, err)
		d, _ := sqldb.Detect(db)
		// Age the record by a minute rather than sleeping.
		if d == sqldb.Postgres {
			_, err = db.Exec(`UPDATE ` + table + ` SET processed_at = processed_at - interval '1 minute'`)
		} else {
			_, err = db.Exec(`UPDATE ` + table + ` SET processed_at = processed_at - 60000000`)
		}
		require.NoError(t, err)
		n, err = short.Cleanup(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		ok, err = short.Apply(ctx, "old", func(*sql.Tx) error { return nil })
		require.NoError(t, err)
		require.True(t, ok, "past the retention a redelivery applies again")
	})
}

// The version gate: an older version after a newer one is ignored, and so
// is a duplicate; concurrent deliveries in random order end at the newest.
func TestVersions(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		v, err := inbox.NewVersions(db, inbox.WithTable(dbtest.Table(t, db, "ver")))
		require.NoError(t, err)
		require.NoError(t, v.CreateSchema(ctx))
		state := dbtest.Table(t, db, "acct")
		_, err = db.Exec(`CREATE TABLE ` + state + ` (id TEXT PRIMARY KEY, balance BIGINT NOT NULL, version BIGINT NOT NULL)`)
		require.NoError(t, err)
		d, _ := sqldb.Detect(db)
		set := func(id string, version int64) func(tx *sql.Tx) error {
			return func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, sqldb.Rebind(d, `INSERT INTO `+state+` (id, balance, version) VALUES (?, ?, ?)
					ON CONFLICT (id) DO UPDATE SET balance = excluded.balance, version = excluded.version`), id, version*10, version)
				return err
			}
		}
		read := func(id string) (balance, version int64) {
			require.NoError(t, db.QueryRow(sqldb.Rebind(d, `SELECT balance, version FROM `+state+` WHERE id = ?`), id).Scan(&balance, &version))
			return
		}

		ok, err := v.Apply(ctx, "a", 2, set("a", 2))
		require.NoError(t, err)
		require.True(t, ok)
		ok, err = v.Apply(ctx, "a", 1, set("a", 1))
		require.NoError(t, err)
		require.False(t, ok, "an old version after a newer one is ignored")
		ok, err = v.Apply(ctx, "a", 2, set("a", 2))
		require.NoError(t, err)
		require.False(t, ok, "a duplicate is ignored")
		b, ver := read("a")
		require.Equal(t, [2]int64{20, 2}, [2]int64{b, ver})
		cur, found, err := v.Current(ctx, "a")
		require.NoError(t, err)
		require.True(t, found)
		require.EqualValues(t, 2, cur)

		// 20 versions, each delivered twice, concurrently, shuffled.
		var versions []int64
		for i := int64(1); i <= 20; i++ {
			versions = append(versions, i, i)
		}
		rand.Shuffle(len(versions), func(i, j int) { versions[i], versions[j] = versions[j], versions[i] })
		var wg sync.WaitGroup
		var mu sync.Mutex
		appliedVersions := map[int64]int{}
		for _, ver := range versions {
			wg.Go(func() {
				ok, err := v.Apply(ctx, "b", ver, set("b", ver))
				require.NoError(t, err)
				if ok {
					mu.Lock()
					appliedVersions[ver]++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		b, ver = read("b")
		require.Equal(t, [2]int64{200, 20}, [2]int64{b, ver}, "the newest version wins")
		require.Equal(t, 1, appliedVersions[20])
		for v, n := range appliedVersions {
			require.Equal(t, 1, n, "version %d applied %d times", v, n)
		}
	})
}

func TestErrors(t *testing.T) {
	ctx := context.Background()
	db := dbtest.SQLite(t)
	_, err := inbox.New(nil)
	require.ErrorIs(t, err, inbox.ErrInvalidOption)
	_, err = inbox.New(db, inbox.WithTable("x;y"))
	require.ErrorIs(t, err, inbox.ErrInvalidOption)
	_, err = inbox.New(db, inbox.WithRetention(0))
	require.ErrorIs(t, err, inbox.ErrInvalidOption)
	_, err = inbox.NewVersions(db, inbox.WithRetention(time.Hour))
	require.ErrorIs(t, err, inbox.ErrInvalidOption)
	in, err := inbox.New(db)
	require.NoError(t, err)
	require.NoError(t, in.CreateSchema(ctx))
	_, err = in.Apply(ctx, "e", nil)
	require.ErrorIs(t, err, inbox.ErrNilFunc)
	_, err = in.Apply(ctx, "", func(*sql.Tx) error { return nil })
	require.ErrorIs(t, err, inbox.ErrInvalidID)
	_, err = in.Record(ctx, nil, "e")
	require.ErrorIs(t, err, inbox.ErrNilTx)
	v, err := inbox.NewVersions(db)
	require.NoError(t, err)
	_, err = v.Gate(ctx, nil, "e", 1)
	require.ErrorIs(t, err, inbox.ErrNilTx)
	_, err = v.Apply(ctx, "", 1, func(*sql.Tx) error { return nil })
	require.ErrorIs(t, err, inbox.ErrInvalidID)
}

// A nil context is an error, not a panic that leaves the transaction (and,
// on a pool of one SQLite connection, the whole database) held: before the
// check, Apply(nil, ...) panicked inside database/sql with its transaction
// open, and the next call on the pool blocked for ever.
func TestNilContext(t *testing.T) {
	ctx := context.Background()
	db := dbtest.SQLite(t)
	in, err := inbox.New(db)
	require.NoError(t, err)
	require.NoError(t, in.CreateSchema(ctx))
	v, err := inbox.NewVersions(db)
	require.NoError(t, err)
	require.NoError(t, v.CreateSchema(ctx))
	var nilCtx context.Context
	fn := func(*sql.Tx) error { return nil }
	calls := map[string]func() error{
		"Inbox.CreateSchema":    func() error { return in.CreateSchema(nilCtx) },
		"Inbox.Apply":           func() error { _, err := in.Apply(nilCtx, "e", fn); return err },
		"Inbox.Seen":            func() error { _, err := in.Seen(nilCtx, "e"); return err },
		"Inbox.Cleanup":         func() error { _, err := in.Cleanup(nilCtx); return err },
		"Versions.CreateSchema": func() error { return v.CreateSchema(nilCtx) },
		"Versions.Apply":        func() error { _, err := v.Apply(nilCtx, "e", 1, fn); return err },
		"Versions.Current":      func() error { _, _, err := v.Current(nilCtx, "e"); return err },
	}
	for name, call := range calls {
		var err error
		require.NotPanics(t, func() { err = call() }, name)
		require.ErrorIs(t, err, inbox.ErrNilContext, name)
	}
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = in.Record(nilCtx, tx, "e")
	require.ErrorIs(t, err, inbox.ErrNilContext)
	_, err = v.Gate(nilCtx, tx, "e", 1)
	require.ErrorIs(t, err, inbox.ErrNilContext)
	require.NoError(t, tx.Rollback())
	applied, err := in.Apply(ctx, "e", fn)
	require.NoError(t, err)
	require.True(t, applied)
}

// An ID with a NUL byte or invalid UTF-8 is ErrInvalidID on both databases:
// before, SQLite stored it and PostgreSQL failed every delivery with a
// database error (a poison message).
func TestInvalidIDBytes(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		in, _ := setup(t, db)
		v, err := inbox.NewVersions(db, inbox.WithTable(dbtest.Table(t, db, "ver")))
		require.NoError(t, err)
		require.NoError(t, v.CreateSchema(ctx))
		fn := func(*sql.Tx) error { return nil }
		for _, id := range []string{"a\x00b", "a\xffb"} {
			_, err := in.Apply(ctx, id, fn)
			require.ErrorIs(t, err, inbox.ErrInvalidID, "%q", id)
			_, err = v.Apply(ctx, id, 1, fn)
			require.ErrorIs(t, err, inbox.ErrInvalidID, "%q", id)
		}
	})
}
