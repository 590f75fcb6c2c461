package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/keysched/keysched/db/sqldb"
)

// dbEnv is one database under test: SQLite (a fresh WAL file per run, in a
// temporary directory) or PostgreSQL at dsn (fresh tables per run).
type dbEnv struct {
	name string // "sqlite" or "postgres"
	dsn  string
	dir  string
	// noNotify: the outbox's schema without its NOTIFY trigger and its
	// relays without LISTEN (outbox.WithNotify(false)).
	noNotify bool
	// notifyWrite: the outbox's Write notifies idle relays itself, no
	// trigger (outbox.WithNotifyFromWrite).
	notifyWrite bool
	// retention: the outbox's relays keep published rows this long
	// (outbox.WithRetention: marked sent by an UPDATE instead of deleted);
	// 0 deletes them (the default).
	retention time.Duration
}

var runs atomic.Int64

func newEnv(ctx context.Context, name, dsn string) (*dbEnv, func(), error) {
	switch name {
	case "sqlite":
		dir, err := os.MkdirTemp("", "outboxbench")
		if err != nil {
			return nil, nil, err
		}
		return &dbEnv{name: name, dir: dir}, func() { os.RemoveAll(dir) }, nil
	case "postgres":
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		db, err := sqldb.OpenPostgres(cctx, dsn)
		if err != nil {
			return nil, nil, err
		}
		db.Close()
		return &dbEnv{name: name, dsn: dsn}, func() {}, nil
	}
	return nil, nil, fmt.Errorf("unknown database %q (sqlite or postgres)", name)
}

// tableName is a name unique to this process and run.
func (e *dbEnv) tableName(prefix string) string {
	return fmt.Sprintf("obb_%s_%d_%d", prefix, os.Getpid(), runs.Add(1))
}

// openSQL opens the run's database through database/sql: SQLite a new file
// (sqldb.OpenSQLite: WAL, busy timeout 10 s, BEGIN IMMEDIATE), PostgreSQL
// through pgx's database/sql driver with at most 32 connections, all kept
// open when idle (database/sql keeps 2 by default: a system whose consumers
// hold more connections at once than the writers, as the outbox's relay does,
// closed and reopened connections through the run, a new backend and its
// prepared statements each time).
func (e *dbEnv) openSQL(ctx context.Context) (*sql.DB, func(), error) {
	if e.name == "sqlite" {
		path := filepath.Join(e.dir, fmt.Sprintf("run%d.db", runs.Add(1)))
		db, err := sqldb.OpenSQLite(path)
		if err != nil {
			return nil, nil, err
		}
		return db, func() {
			db.Close()
			for _, suffix := range []string{"", "-wal", "-shm"} {
				os.Remove(path + suffix)
			}
		}, nil
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	db, err := sqldb.OpenPostgres(cctx, e.dsn)
	if err != nil {
		return nil, nil, err
	}
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	return db, func() { db.Close() }, nil
}
