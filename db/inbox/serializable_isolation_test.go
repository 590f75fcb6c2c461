package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/inbox"
	"github.com/keysched/keysched/db/internal/dbtest"
)

// openWithIsolation opens a second pool on the test database whose
// sessions default to the isolation level (default_transaction_isolation),
// as a database or role configured that way gives every transaction.
func openWithIsolation(t *testing.T, level string) *sql.DB {
	t.Helper()
	dbtest.Postgres(t) // skips or fails as the other PostgreSQL tests do
	cfg, err := pgx.ParseConfig(dbtest.DSN())
	require.NoError(t, err)
	cfg.RuntimeParams["default_transaction_isolation"] = level
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { db.Close() })
	var got string
	require.NoError(t, db.QueryRow(`SHOW transaction_isolation`).Scan(&got))
	require.Equal(t, level, got)
	return db
}

// Found by attacking the code (adversarial review, 2026-12-02): on a
// PostgreSQL whose default isolation is REPEATABLE READ or SERIALIZABLE,
// duplicates of one event delivered concurrently (16 at a time, from two
// pools) got "could not serialize access due to concurrent update"
// (SQLSTATE 40001) from the ID's insert instead of "already handled";
// Versions' gate the same.
//
// Under either level, concurrent duplicates apply once and the others get
// (false, nil); concurrent versions of one entity all return without an
// error and the newest wins: a serialization failure of the ID's insert or
// the version's gate (before fn runs) begins the transaction again.
func TestApplyUnderStricterIsolationIsNotASerializationError(t *testing.T) {
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			ctx := context.Background()
			a, b := openWithIsolation(t, level), openWithIsolation(t, level)
			table := dbtest.Table(t, a, "ibiso")
			ia, err := inbox.New(a, inbox.WithTable(table))
			require.NoError(t, err)
			ib, err := inbox.New(b, inbox.WithTable(table))
			require.NoError(t, err)
			require.NoError(t, ia.CreateSchema(ctx))
			const rounds, deliveries = 8, 8
			for round := range rounds {
				id := fmt.Sprint("evt-", round)
				var runs, handled atomic.Int32
				var wg sync.WaitGroup
				start := make(chan struct{})
				for g := range deliveries {
					in := ia
					if g%2 == 1 {
						in = ib
					}
					wg.Go(func() {
						<-start
						ok, err := in.Apply(ctx, id, func(*sql.Tx) error {
							runs.Add(1)
							time.Sleep(time.Millisecond)
							return nil
						})
						if err != nil {
							t.Errorf("delivery of %s: %v", id, err)
						} else if !ok {
							handled.Add(1)
						}
					})
				}
				close(start)
				wg.Wait()
				require.EqualValues(t, 1, runs.Load(), "%s applied once", id)
				require.EqualValues(t, deliveries-1, handled.Load(), "%s: the other deliveries already handled", id)
			}

			vt := dbtest.Table(t, a, "vriso")
			v, err := inbox.NewVersions(a, inbox.WithTable(vt))
			require.NoError(t, err)
			require.NoError(t, v.CreateSchema(ctx))
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					for i := range 5 {
						if _, err := v.Apply(ctx, "e", int64(g*5+i), func(*sql.Tx) error { return nil }); err != nil {
							t.Errorf("version %d: %v", g*5+i, err)
						}
					}
				})
			}
			wg.Wait()
			cur, ok, err := v.Current(ctx, "e")
			require.NoError(t, err)
			require.True(t, ok)
			require.EqualValues(t, 39, cur)
		})
	}
}
