package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
)

// eventArgs is one event as a River job.
type eventArgs struct {
	Key string `json:"key"`
	N   int    `json:"n"`
}

func (eventArgs) Kind() string { return "outboxbench_event" }

type eventWorker struct {
	river.WorkerDefaults[eventArgs]
	deliver func(context.Context, int) error
}

func (w *eventWorker) Work(ctx context.Context, job *river.Job[eventArgs]) error {
	return w.deliver(ctx, job.Args.N)
}

// fastRetry retries a failed job after 10 ms doubling to 100 ms, as the
// outbox relay is configured here (River's default waits attempt^4 seconds).
type fastRetry struct{}

func (fastRetry) NextRetry(job *rivertype.JobRow) time.Time {
	d := 10 * time.Millisecond << min(job.Attempt, 4)
	return time.Now().Add(min(d, 100*time.Millisecond))
}

// riverSystem is River: the application inserts a job in its transaction
// (InsertTx), River workers deliver it. River promises no order per key.
type riverSystem[TTx any] struct {
	driver riverdriver.Driver[TTx]
	schema string
	keys   int
	begin  func(ctx context.Context) (TTx, func() error, func(), error)
	drop   func()
	ins    *river.Client[TTx] // inserts only (River inserts through a client)
}

func newRiverSystem(ctx context.Context, env *dbEnv, keys int) (system, error) {
	if env.name == "sqlite" {
		db, closeDB, err := env.openSQL(ctx)
		if err != nil {
			return nil, err
		}
		// riversqlite's documentation: River runs internal operations in
		// parallel, which SQLite answers with SQLITE_BUSY; "a good workaround
		// to avoid errors is to set the maximum pool size to one connection".
		// Without it a writer got SQLITE_BUSY past the 10 s busy timeout
		// (2026-12-01, 20,000 events, 2 clients).
		db.SetMaxOpenConns(1)
		s := &riverSystem[*sql.Tx]{driver: riversqlite.New(db), keys: keys, drop: closeDB,
			begin: func(ctx context.Context) (*sql.Tx, func() error, func(), error) {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return nil, nil, nil, err
				}
				return tx, tx.Commit, func() { tx.Rollback() }, nil
			}}
		if err := s.migrate(ctx); err != nil {
			closeDB()
			return nil, err
		}
		return s, nil
	}
	cfg, err := pgxpool.ParseConfig(env.dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	schema := env.tableName("river")
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		pool.Close()
		return nil, err
	}
	s := &riverSystem[pgx.Tx]{driver: riverpgxv5.New(pool), schema: schema, keys: keys,
		drop: func() {
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
			pool.Close()
		},
		begin: func(ctx context.Context) (pgx.Tx, func() error, func(), error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return nil, nil, nil, err
			}
			return tx, func() error { return tx.Commit(ctx) }, func() { _ = tx.Rollback(context.Background()) }, nil
		}}
	if err := s.migrate(ctx); err != nil {
		s.drop()
		return nil, err
	}
	return s, nil
}

// migrate creates River's tables and the inserting client.
func (s *riverSystem[TTx]) migrate(ctx context.Context) error {
	m, err := rivermigrate.New(s.driver, &rivermigrate.Config{Schema: s.schema, Logger: quiet})
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrate: %w", err)
	}
	s.ins, err = s.client(nil)
	return err
}

func (s *riverSystem[TTx]) close() { s.drop() }

func (s *riverSystem[TTx]) tables() string { return s.schema + ".%" }

// client is a River client; with deliver nil, one that only inserts.
func (s *riverSystem[TTx]) client(deliver func(context.Context, int) error) (*river.Client[TTx], error) {
	cfg := &river.Config{Schema: s.schema, Logger: quiet}
	if deliver != nil {
		workers := river.NewWorkers()
		river.AddWorker(workers, &eventWorker{deliver: deliver})
		cfg.Workers = workers
		// As many workers as a relay's keysched pool, polling as often.
		cfg.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 64}}
		cfg.FetchCooldown = 20 * time.Millisecond
		cfg.FetchPollInterval = 20 * time.Millisecond
		cfg.RetryPolicy = fastRetry{}
		cfg.MaxAttempts = 1 << 20
	}
	return river.NewClient(s.driver, cfg)
}

func (s *riverSystem[TTx]) writeTx(ctx context.Context, idx []int) error {
	tx, commit, rollback, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer rollback()
	for _, i := range idx {
		if _, err := s.ins.InsertTx(ctx, tx, eventArgs{Key: keyName(i % s.keys), N: i}, nil); err != nil {
			return err
		}
	}
	return commit()
}

func (s *riverSystem[TTx]) start(ctx context.Context, n int, deliver func(context.Context, int) error) (func(context.Context) error, error) {
	var cs []*river.Client[TTx]
	for range n {
		c, err := s.client(deliver)
		if err != nil {
			return nil, err
		}
		if err := c.Start(ctx); err != nil {
			return nil, err
		}
		cs = append(cs, c)
	}
	return func(cctx context.Context) error {
		var errs []error
		for _, c := range cs {
			errs = append(errs, c.Stop(cctx))
		}
		return errors.Join(errs...)
	}, nil
}
