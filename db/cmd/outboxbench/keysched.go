package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/outbox"
)

var quiet = slog.New(slog.DiscardHandler)

// outboxSystem is keysched's outbox: outbox.Write in the application's
// transaction, relays publishing to the sink.
type outboxSystem struct {
	ob     *outbox.Outbox
	retain time.Duration
	keys   int
	batch  int
	drop   func()
	name   string
}

func newOutboxSystem(ctx context.Context, env *dbEnv, keys, batch int) (system, error) {
	db, closeDB, err := env.openSQL(ctx)
	if err != nil {
		return nil, err
	}
	name := env.tableName("outbox")
	opts := []outbox.Option{outbox.WithTable(name), outbox.WithNotify(!env.noNotify)}
	if env.notifyWrite {
		opts = append(opts, outbox.WithNotifyFromWrite())
	}
	ob, err := outbox.New(db, opts...)
	if err != nil {
		closeDB()
		return nil, err
	}
	if err := ob.CreateSchema(ctx); err != nil {
		closeDB()
		return nil, err
	}
	drop := func() {
		// Best effort: a table left behind is named for this run only.
		_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+name)
		_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+name+"_lease")
		_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+name+"_idle")
		if ob.Dialect() == outbox.Postgres {
			_, _ = db.ExecContext(ctx, "DROP FUNCTION IF EXISTS "+name+"_notify() CASCADE")
		}
		closeDB()
	}
	return &outboxSystem{ob: ob, retain: env.retention, keys: keys, batch: batch, drop: drop, name: name}, nil
}

func (s *outboxSystem) close() { s.drop() }

func (s *outboxSystem) tables() string { return "%." + s.name + "%" }

func (s *outboxSystem) writeTx(ctx context.Context, idx []int) error {
	tx, err := s.ob.DB().BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, i := range idx {
		if _, err := s.ob.Write(ctx, tx, outbox.Event{Key: keyName(i % s.keys), Type: "deposit", Payload: []byte(strconv.Itoa(i))}); err != nil {
			return err
		}
	}
	return tx.Commit()
}

func (s *outboxSystem) start(ctx context.Context, n int, deliver func(context.Context, int) error) (func(context.Context) error, error) {
	sink := func(ctx context.Context, e outbox.Event) error {
		i, err := strconv.Atoi(string(e.Payload))
		if err != nil {
			return fmt.Errorf("payload %q: %w", e.Payload, err)
		}
		return deliver(ctx, i)
	}
	var rs []*outbox.Relay
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		// The failing key is retried for the whole run (no dead letter),
		// every 10 ms to 100 ms.
		r, err := s.ob.NewRelay(sink, outbox.WithLogger(quiet), outbox.WithBatchSize(s.batch),
			outbox.WithPollInterval(20*time.Millisecond), outbox.WithRetention(s.retain),
			outbox.WithRetry(keysched.RetryPolicy{MaxAttempts: 1 << 30, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}))
		if err != nil {
			return nil, err
		}
		rs = append(rs, r)
		wg.Add(1)
		go func() { defer wg.Done(); errs <- r.Run(ctx) }()
	}
	return func(cctx context.Context) error {
		var all []error
		for _, r := range rs {
			all = append(all, r.Close(cctx))
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			all = append(all, e)
		}
		return errors.Join(all...)
	}, nil
}
