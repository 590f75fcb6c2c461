// Package dbtest opens the databases the db module's tests run on: SQLite in
// a temporary directory, and PostgreSQL from KEYSCHED_TEST_POSTGRES.
package dbtest

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/keysched/keysched/db/sqldb"
)

// DefaultPostgresDSN is used when KEYSCHED_TEST_POSTGRES is unset: the local
// server's Unix socket, database keysched_test, as the current OS user (peer
// authentication).
const DefaultPostgresDSN = "host=/var/run/postgresql dbname=keysched_test"

// EnvDSN names the variable holding the test server's DSN. Without a server
// the PostgreSQL tests fail (a test command that passes is never one that
// silently left them out) unless EnvSkip is set to 1, which skips them without
// trying to connect.
const (
	EnvDSN  = "KEYSCHED_TEST_POSTGRES"
	EnvSkip = "KEYSCHED_SKIP_POSTGRES"
)

// SetupHint says how to start the server and create the role and database
// the tests use (README.md, "Testing"), or how to opt out.
const SetupHint = "*** Start it (Debian, as root): pg_ctlcluster 15 main start; " +
	"runuser -u postgres -- createuser --superuser \"$(id -un)\"; runuser -u postgres -- createdb -O \"$(id -un)\" keysched_test\n" +
	"*** Or skip the PostgreSQL tests: " + EnvSkip + "=1\n"

var (
	pgOnce sync.Once
	pgDB   *sql.DB
	pgErr  error
	seq    atomic.Int64
)

// DSN returns the PostgreSQL DSN the tests use.
func DSN() string {
	if d := os.Getenv(EnvDSN); d != "" {
		return d
	}
	return DefaultPostgresDSN
}

// Postgres returns the shared test database. It skips t when
// KEYSCHED_SKIP_POSTGRES=1, and fails it, saying how to start the server or
// opt out, when no server answers.
func Postgres(t testing.TB) *sql.DB {
	t.Helper()
	if os.Getenv(EnvSkip) == "1" {
		t.Skipf("%s=1: PostgreSQL tests skipped", EnvSkip)
	}
	pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		pgDB, pgErr = sqldb.OpenPostgres(ctx, DSN())
		if pgDB != nil {
			pgDB.SetMaxOpenConns(40)
		}
	})
	if pgErr != nil {
		t.Fatalf("\n*** POSTGRESQL NOT AVAILABLE: %v\n*** DSN %q (set %s).\n%s", pgErr, DSN(), EnvDSN, SetupHint)
	}
	return pgDB
}

// SQLite opens a fresh SQLite database file in t's temporary directory.
func SQLite(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sqldb.OpenSQLite(t.TempDir() + "/test.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Table returns a table name unique in this test process, for tests that
// share the PostgreSQL database; it drops the table and its lease table when
// t ends (with the outbox's idle table on PostgreSQL).
func Table(t testing.TB, db *sql.DB, prefix string) string {
	name := fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), seq.Add(1))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, s := range []string{name, name + "_lease", name + "_idle"} {
			_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+s) // best effort: named for this test only
		}
		if d, _ := sqldb.Detect(db); d == sqldb.Postgres {
			_, _ = db.ExecContext(ctx, "DROP FUNCTION IF EXISTS "+name+"_notify() CASCADE")
		}
	})
	return name
}

// Each runs f as a subtest on SQLite and on PostgreSQL.
func Each(t *testing.T, f func(t *testing.T, db *sql.DB)) {
	t.Helper()
	t.Run("sqlite", func(t *testing.T) { f(t, SQLite(t)) })
	t.Run("postgres", func(t *testing.T) { f(t, Postgres(t)) })
}

// Name returns the dialect's name for messages.
func Name(db *sql.DB) string {
	d, _ := sqldb.Detect(db)
	return strings.ToLower(d.String())
}

// LeakOptions are the goleak options of the db module's TestMains: the
// goroutines that exist before the tests (ants's default pool), and the
// per-connection goroutines of database/sql and pgx that belong to the
// shared PostgreSQL pool (Postgres), which stays open for the whole test
// process: its connection opener, pgx's context watcher, and pgx's
// background reader, which a connection runs while a cancelled query's
// answer is still being read (seen once leaking past the last test under
// load, with every test passed).
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreCurrent(),
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgconn/ctxwatch.(*ContextWatcher).Watch.func1"),
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgconn/internal/bgreader.(*BGReader).bgRead"),
	}
}

// OptOutLine is the line AnnounceOptOut prints when EnvSkip is 1.
const OptOutLine = "*** " + EnvSkip + "=1: the PostgreSQL tests of this package are skipped"

// AnnounceOptOut prints OptOutLine to stderr when EnvSkip is 1, for a
// TestMain to call, so that skipped PostgreSQL tests show without -v: go
// test shows the line when run in the package's directory with no package
// argument, with -v, and when the package fails (with package arguments,
// as in go test ./..., go test hides the output of a package that passes,
// this line too). It prints nothing otherwise.
func AnnounceOptOut() {
	if os.Getenv(EnvSkip) == "1" {
		fmt.Fprintln(os.Stderr, OptOutLine)
	}
}

// CheckOptOutAnnounced runs the test binary again, running no test, with
// EnvSkip=1 and then with EnvSkip unset, and fails t unless the first prints
// OptOutLine and the second does not: it checks that the package's TestMain
// calls AnnounceOptOut.
func CheckOptOutAnnounced(t *testing.T) {
	t.Helper()
	for _, skip := range []string{"1", ""} {
		cmd := exec.Command(os.Args[0], "-test.run", "^$", "-test.count=1")
		env := []string{}
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, EnvSkip+"=") {
				env = append(env, kv)
			}
		}
		if skip != "" {
			env = append(env, EnvSkip+"="+skip)
		}
		cmd.Env = env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s=%q: the test binary, running no test, failed: %v\n%s", EnvSkip, skip, err, stderr.String())
		}
		if got := strings.Contains(stderr.String(), OptOutLine); got != (skip == "1") {
			t.Fatalf("%s=%q: stderr has the line %q: %v, want %v; stderr:\n%s", EnvSkip, skip, OptOutLine, got, skip == "1", stderr.String())
		}
	}
}
