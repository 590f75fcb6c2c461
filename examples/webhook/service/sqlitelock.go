package service

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ErrSQLiteInUse is returned by OpenSQLite when another Store (of this
// process or another one) has the same SQLite file open: one process per
// SQLite file (several instances need PostgreSQL). The error names the
// lock file and the pid written in it.
var ErrSQLiteInUse = errors.New("webhook: SQLite database in use by another service process")

// lockSQLite takes an exclusive advisory lock (flock, not waiting) on the
// file next to db's main database file, named after it with ".lock"
// appended, and writes this process's pid in it. The lock lasts as long as
// the returned file is open: Store.Close closes it, and the kernel drops
// it when the process dies (a crash leaves nothing to clean up). A lock
// file, not the database file itself: SQLite's own locks on the database
// are fcntl locks, which a flock on the same file could meet on file
// systems that emulate one with the other (NFS).
func lockSQLite(ctx context.Context, db *sql.DB) (*os.File, error) {
	path, err := sqliteMainFile(ctx, db)
	if err != nil || path == "" {
		return nil, err
	}
	name := path + ".lock"
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("webhook: SQLite lock file: %w", err)
	}
	held, err := flockExclusive(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("webhook: locking %s: %w", name, err)
	}
	if held {
		pid, _ := os.ReadFile(name)
		f.Close()
		by := "another process"
		if p := strings.TrimSpace(string(pid)); p != "" {
			by = "pid " + p
		}
		return nil, fmt.Errorf("%w: %s is locked by %s (%s): one process per SQLite file; several instances need PostgreSQL", ErrSQLiteInUse, path, by, name)
	}
	// The holder's pid, for the next one's error (best effort).
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// sqliteMainFile returns the file of db's main database ("" for one
// without a file).
func sqliteMainFile(ctx context.Context, db *sql.DB) (string, error) {
	rows, err := db.QueryContext(ctx, `PRAGMA database_list`)
	if err != nil {
		return "", fmt.Errorf("webhook: SQLite database_list: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var seq int
		var name string
		var file sql.NullString
		if err := rows.Scan(&seq, &name, &file); err != nil {
			return "", fmt.Errorf("webhook: SQLite database_list: %w", err)
		}
		if name == "main" {
			return file.String, nil
		}
	}
	return "", rows.Err()
}
