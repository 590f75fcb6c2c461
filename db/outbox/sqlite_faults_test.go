package outbox_test

import (
	"bufio"
	"context"
	"database/sql"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/sqldb"
)

// sqliteHolderEnv names the variable that makes the test binary run
// sqliteHolderChild (TestSQLiteSecondProcessHoldsWriteLock's second
// process): the database file; OUTBOX_SQLITE_TABLE holds the table.
const sqliteHolderEnv = "OUTBOX_SQLITE_HOLD"

// sqliteHolderChild opens the file as an application would (OpenSQLite),
// begins a write transaction, writes one event of key "child" in it, prints
// "holding", and commits when stdin closes.
func sqliteHolderChild() {
	ctx := context.Background()
	db, err := sqldb.OpenSQLite(os.Getenv(sqliteHolderEnv))
	if err != nil {
		panic(err)
	}
	ob, err := outbox.New(db, outbox.WithTable(os.Getenv("OUTBOX_SQLITE_TABLE")))
	if err != nil {
		panic(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	if _, err := ob.Write(ctx, tx, outbox.Event{ID: "child/0", Key: "child", Payload: []byte("0")}); err != nil {
		panic(err)
	}
	os.Stdout.WriteString("holding\n")
	io.Copy(io.Discard, os.Stdin)
	if err := tx.Commit(); err != nil {
		panic(err)
	}
	os.Exit(0)
}

// openSQLiteBusy opens path as sqldb.OpenSQLite does, with a busy timeout
// of busy (OpenSQLite's is 10 s).
func openSQLiteBusy(t *testing.T, path string, busy time.Duration) *sql.DB {
	t.Helper()
	q := url.Values{}
	q.Add("_pragma", "busy_timeout("+strings.TrimSuffix(busy.String(), "ms")+")")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_txlock", "immediate")
	db, err := sql.Open("sqlite", path+"?"+q.Encode())
	require.NoError(t, err)
	require.NoError(t, db.Ping())
	t.Cleanup(func() { db.Close() })
	return db
}

// A second process holding SQLite's write lock (a write transaction left
// open) past the busy timeout (100 ms here): the application's BeginTx gets
// SQLITE_BUSY (a conflict, by sqldb.Classify); the relay's claims fail the
// same way, counted as conflicts and logged once; when the other process
// commits, every event (its own included) is published, in order.
func TestSQLiteSecondProcessHoldsWriteLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "app.db")
	db := openSQLiteBusy(t, path, 100*time.Millisecond)
	ob, err := outbox.New(db, outbox.WithTable("busy"))
	require.NoError(t, err)
	require.NoError(t, ob.CreateSchema(context.Background()))
	const keys, perKey = 3, 10
	writeEvents(t, ob, keys, perKey, 10)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), sqliteHolderEnv+"="+path, "OUTBOX_SQLITE_TABLE=busy")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "child: %s", stderr.String())
	require.Equal(t, "holding\n", line)

	_, err = db.BeginTx(context.Background(), nil)
	require.Error(t, err, "the write lock is the other process's")
	t.Logf("BeginTx: %v", err)
	require.Equal(t, sqldb.KindConflict, sqldb.Classify(err))

	got := map[string][]int{}
	rec := newRecorder(keys*perKey + 1)
	logs := newLogLines()
	r, stop := startRelay(t, ob, rec.sink, outbox.WithLogger(slog.New(logs)), outbox.WithPollInterval(10*time.Millisecond))
	waitUntil(t, "conflicts", func() bool { return r.Stats().DBErrorKinds.Conflict >= 3 })
	require.Zero(t, r.Stats().Published, "nothing claimed while the other process writes")
	require.NoError(t, stdin.Close())
	require.NoError(t, cmd.Wait(), "child: %s", stderr.String())
	rec.wait(t, 30*time.Second)
	waitHealthy(t, r)
	stop()
	st := r.Stats()
	t.Logf("stats %+v", st)
	rec.mu.Lock()
	for k, v := range rec.byKey {
		got[k] = v
	}
	rec.mu.Unlock()
	require.Equal(t, []int{0}, got["child"])
	delete(rec.byKey, "child")
	rec.check(t, keys, perKey)
	require.Equal(t, st.DBErrors, st.DBErrorKinds.Conflict, "every failure a conflict")
	require.Equal(t, 1, logs.count(msgFailing), "one outage:\n%s", logs.dump())
	require.Equal(t, 1, logs.count(msgRecovered), "one outage:\n%s", logs.dump())
	require.Zero(t, counts(t, ob)[outbox.Pending])
}

// immutable sets or clears the immutable attribute of paths (chattr), which
// holds for root too (a mode without w does not).
func immutable(t *testing.T, on bool, paths ...string) {
	t.Helper()
	flag := "-i"
	if on {
		flag = "+i"
	}
	out, err := exec.Command("chattr", append([]string{flag}, paths...)...).CombinedOutput()
	if err != nil {
		if on {
			t.Skipf("chattr +i (needs root and ext4 or similar): %v: %s", err, out)
		}
		t.Errorf("chattr -i: %v: %s", err, out)
	}
}

// The SQLite file's directory made read-only after the relay started
// (immutable, which holds for root too): nothing changes while the
// database's files exist (in WAL mode SQLite creates no file while a
// connection is open): writes and publishing go on. Then the database's
// files themselves made immutable (the storage refusing writes) while the
// relay has published rows to mark: the application's writes fail
// (SQLITE_IOERR, a storage error by sqldb.Classify), the relay's marks fail
// the same way and are counted as storage errors and logged once; once the
// files are writable again, every event is marked, nothing lost, in order.
func TestSQLiteReadOnlyStorage(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.db")
	db, err := sqldb.OpenSQLite(path)
	require.NoError(t, err)
	defer db.Close()
	ob, err := outbox.New(db, outbox.WithTable("ro"))
	require.NoError(t, err)
	require.NoError(t, ob.CreateSchema(context.Background()))
	const keys = 3
	ctx := context.Background()
	write := func(j int) error {
		for k := range keys {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if _, err := ob.Write(ctx, tx, outbox.Event{Key: key(k), Payload: []byte(strconv.Itoa(j))}); err != nil {
				tx.Rollback()
				return err
			}
			if err := tx.Commit(); err != nil {
				return err
			}
		}
		return nil
	}
	for j := range 10 {
		require.NoError(t, write(j))
	}
	rec := newRecorder(keys * 13)
	gate := make(chan struct{})
	sink := func(ctx context.Context, e outbox.Event) error {
		if string(e.Payload) == "12" {
			select { // published once the files are immutable
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return rec.sink(ctx, e)
	}
	logs := newLogLines()
	r, stop := startRelay(t, ob, sink, outbox.WithLogger(slog.New(logs)), outbox.WithPollInterval(10*time.Millisecond))
	waitUntil(t, "first events marked", func() bool { return r.Stats().Marked >= keys*10 })

	immutable(t, true, dir)
	defer immutable(t, false, dir)
	require.NoError(t, write(10), "a read-only directory does not stop writes")
	require.NoError(t, write(11))
	require.NoError(t, write(12))
	waitUntil(t, "rows 10, 11 marked", func() bool { return r.Stats().Marked >= keys*12 })
	require.Zero(t, r.Stats().DBErrors, "a read-only directory does not stop the relay")

	files, err := filepath.Glob(path + "*")
	require.NoError(t, err)
	require.Len(t, files, 3, "the database, its WAL and shared memory files")
	// The database and its WAL, not the shared-memory file: SQLite maps
	// that one (MAP_SHARED), and a write to a mapped page of an immutable
	// file is a SIGBUS, which crashed the test binary now and then (a
	// fault of the test's making: a storage that refuses writes answers
	// write calls, it does not revoke a mapping).
	files = []string{path, path + "-wal"}
	immutable(t, true, files...)
	defer immutable(t, false, files...)
	err = write(13)
	require.Error(t, err)
	t.Logf("Write on immutable files: %v", err)
	require.Equal(t, sqldb.KindStorage, sqldb.Classify(err))
	close(gate) // rows 12 published: their marks fail
	waitUntil(t, "storage errors", func() bool { return r.Stats().DBErrorKinds.Storage >= 3 })
	require.Less(t, r.Stats().Marked, uint64(keys*13))
	immutable(t, false, files...)
	rec.wait(t, 30*time.Second)
	waitUntil(t, "rows 12 marked", func() bool { return counts(t, ob)[outbox.Pending] == 0 })
	waitHealthy(t, r)
	stop()
	st := r.Stats()
	t.Logf("stats %+v", st)
	rec.check(t, keys, 13)
	require.Equal(t, st.DBErrors, st.DBErrorKinds.Storage, "every failure a storage error")
	require.Equal(t, 1, logs.count(msgFailing), "one outage:\n%s", logs.dump())
	require.Equal(t, 1, logs.count(msgRecovered), "one outage:\n%s", logs.dump())
}
