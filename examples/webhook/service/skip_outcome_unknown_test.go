package service

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/outbox"
	"github.com/keysched/keysched/db/sqldb"
	"github.com/keysched/keysched/examples/webhook/sim"
)

// cutDriver is the SQLite driver with one fault: once armed, the first query
// whose text contains match runs to its end (its rows read: an autocommit
// write commits), then the caller's context is cancelled and the query
// returns the context's error, as when ctx ends while the statement is in
// flight and the server completes it anyway.
type cutDriver struct {
	inner driver.Driver
	dsn   string
	arm   atomic.Pointer[cutArm]
}

type cutArm struct {
	match  string
	cancel context.CancelFunc
}

// openCutSQLite opens the SQLite file path through a cutDriver, with
// OpenSQLite's settings and one connection (as OpenSQLite's Store).
func openCutSQLite(t *testing.T, path string) (*sql.DB, *cutDriver) {
	t.Helper()
	plain, err := sqldb.OpenSQLite(path)
	require.NoError(t, err)
	d := &cutDriver{inner: plain.Driver(), dsn: path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"}
	require.NoError(t, plain.Close())
	db := sql.OpenDB(d)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db, d
}

func (d *cutDriver) Connect(context.Context) (driver.Conn, error) {
	c, err := d.inner.Open(d.dsn)
	if err != nil {
		return nil, err
	}
	return &cutConn{Conn: c, d: d}, nil
}

func (d *cutDriver) Driver() driver.Driver { return d.inner }

type cutConn struct {
	driver.Conn
	d *cutDriver
}

func (c *cutConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (c *cutConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, q)
}

func (c *cutConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, q, args)
}

func (c *cutConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := c.Conn.(driver.QueryerContext).QueryContext(ctx, q, args)
	a := c.d.arm.Load()
	if err != nil || a == nil || !strings.Contains(q, a.match) || !c.d.arm.CompareAndSwap(a, nil) {
		return rows, err
	}
	dest := make([]driver.Value, len(rows.Columns()))
	for rows.Next(dest) == nil {
	}
	_ = rows.Close()
	a.cancel()
	return nil, ctx.Err()
}

func (c *cutConn) CheckNamedValue(nv *driver.NamedValue) error {
	if v, ok := c.Conn.(driver.NamedValueChecker); ok {
		return v.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

// A Skip whose statement took effect while its context ended (the outcome
// unknown to the caller: outbox.ErrOutcomeUnknown) left the event counted in
// the partner's backlog, on SQLite for ever (no delivery would take it
// off): the backlog said 2 where the database held 1 undelivered event. The
// service now reads the event's state after such an outcome and settles the
// backlog: it converges to the database's count, the skip is counted once,
// and a Skip tried again gives up nothing more.
func TestSkipWithUnknownOutcomeSettlesTheBacklog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "webhook.db")
	var cut *cutDriver
	h := newHarnessOn(t, func() (*Store, error) {
		var db *sql.DB
		db, cut = openCutSQLite(t, path)
		return NewStore(t.Context(), db)
	}, map[string]sim.Behavior{"p": {Down: true}}, func(c *Config) {
		c.Retry = keysched.RetryPolicy{MaxAttempts: 1, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}
	})
	_, x := h.post("p", 0)
	h.post("p", 1)
	require.Eventually(t, func() bool { return h.head("p") == x }, waitLong, 5*time.Millisecond)
	require.Equal(t, 2, h.status("p").Backlog)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cut.arm.Store(&cutArm{match: "AND id = ", cancel: cancel}) // SkipEvent's statement
	err := h.svc.Skip(ctx, "p", x)
	require.ErrorIs(t, err, outbox.ErrOutcomeUnknown)
	require.Nil(t, cut.arm.Load(), "the cut was made")
	st, err := h.store.Outbox().Lookup(context.Background(), x)
	require.NoError(t, err)
	require.Equal(t, outbox.Skipped, st.State, "the skip took effect")

	undelivered := func() int {
		var n int
		require.NoError(t, h.store.db.QueryRow(`SELECT COUNT(*) FROM `+h.store.Outbox().Table()+` WHERE state IN (0, 2)`).Scan(&n))
		return n
	}
	require.Eventually(t, func() bool { return h.status("p").Backlog == undelivered() }, 10*time.Second, 5*time.Millisecond,
		"the backlog converges to the database's count")
	require.Equal(t, 1, h.status("p").Backlog)
	require.Equal(t, uint64(1), h.status("p").Skipped)
	// Tried again: nothing more given up, nothing counted twice.
	err = h.svc.Skip(context.Background(), "p", x)
	require.True(t, errors.Is(err, ErrHeadChanged) || errors.Is(err, ErrNotParked), "%v", err)
	require.Equal(t, uint64(1), h.status("p").Skipped)
	require.Equal(t, undelivered(), h.status("p").Backlog)
}
