// Package schemacheck checks, before a CreateSchema runs its statements
// (CREATE ... IF NOT EXISTS, which skip a name that is taken, whatever
// took it), that every name the schema creates is either free or already
// the object the schema would create: a table with the columns it needs,
// an index or trigger on the right table, a sequence. A name taken by
// anything else (another outbox's lease table, an inbox's table, an index
// of another table, a view) is an error wrapping sqldb.ErrSchemaConflict,
// naming the object, what holds the name and what the schema needs.
package schemacheck

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/keysched/keysched/db/sqldb"
	"github.com/keysched/keysched/internal/optcheck"
)

// The kinds of objects.
const (
	Table    = "table"
	Index    = "index"
	Sequence = "sequence"
	Trigger  = "trigger"
	Function = "function" // PostgreSQL: a function of no arguments
)

// An Object is one object a schema creates: Kind; for a table the columns
// it must have (those the code reads, not those a later ALTER adds); for an
// index or a trigger the table it is on.
type Object struct {
	Name, Kind string
	Columns    []string // Table
	On         string   // Index, Trigger
	Source     string   // Function: text its body contains (every version's)
}

// Querier is a *sql.Tx or a *sql.DB.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Check checks objs on q (see the package doc). what names the schema's
// owner in errors ("outbox table x"). On PostgreSQL the names are looked up
// in current_schema(), where the unqualified CREATE statements create them.
func Check(ctx context.Context, q Querier, d sqldb.Dialect, what string, objs []Object) error {
	for _, o := range objs {
		if o.Kind == Function {
			if err := checkFunction(ctx, q, d, what, o); err != nil {
				return err
			}
			continue
		}
		kind, on, err := lookup(ctx, q, d, o.Name, o.Kind == Trigger)
		if err != nil {
			return fmt.Errorf("check %s: %w", o.Name, err)
		}
		if kind == "" {
			continue // free: the schema creates it
		}
		if kind != o.Kind || (o.Kind == Index || o.Kind == Trigger) && !sameName(d, on, o.On) {
			return fmt.Errorf("%w: %s needs the %s %s%s, but %s is %s %s%s: choose another table name (WithTable) or drop it", sqldb.ErrSchemaConflict, what, o.Kind, o.Name, onText(o.On), o.Name, article(kind), kind, onText(on))
		}
		switch o.Kind {
		case Table:
			cols, err := columns(ctx, q, d, o.Name)
			if err != nil {
				return fmt.Errorf("check %s: %w", o.Name, err)
			}
			var missing []string
			for _, c := range o.Columns {
				if !slices.ContainsFunc(cols, func(col string) bool { return sameName(d, col, c) }) {
					missing = append(missing, c)
				}
			}
			if len(missing) > 0 {
				return fmt.Errorf("%w: %s needs the table %s with the columns %s, but the existing table %s (columns %s) lacks %s: it is not this schema's table (another outbox's or inbox's, or the application's); choose another table name (WithTable) or drop it",
					sqldb.ErrSchemaConflict, what, o.Name, strings.Join(o.Columns, ", "), o.Name, strings.Join(cols, ", "), strings.Join(missing, ", "))
			}
		}
	}
	return nil
}

// checkFunction checks the function o (PostgreSQL; no arguments): free, or
// one whose body contains o.Source (this schema's, of any version). The
// schema replaces its function (CREATE OR REPLACE) or drops it (WithNotify
// off): an application's function of that name would be lost.
func checkFunction(ctx context.Context, q Querier, d sqldb.Dialect, what string, o Object) error {
	if d != sqldb.Postgres {
		return nil
	}
	var src string
	err := q.QueryRowContext(ctx, `SELECT prosrc FROM pg_proc
	WHERE proname = $1 AND pronargs = 0 AND pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())`, o.Name).Scan(&src)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check %s(): %w", o.Name, err)
	}
	if !strings.Contains(src, o.Source) {
		return fmt.Errorf("%w: %s replaces or drops the function %s(), but the existing %s() is not this schema's (its body lacks %s): choose another table name (WithTable) or rename that function", sqldb.ErrSchemaConflict, what, o.Name, o.Name, o.Source)
	}
	return nil
}

// sameName reports whether the names a and b, as the catalog stores them,
// name the same object or column for the unquoted lower-case names of the
// statements: on SQLite names are case-insensitive (ASCII) and stored as
// written (a table created as ORDERS, an index ON Orders); PostgreSQL folds
// an unquoted name to lower case when it stores it, and a quoted "Orders"
// is another name.
func sameName(d sqldb.Dialect, a, b string) bool {
	if d == sqldb.Postgres {
		return a == b
	}
	return strings.EqualFold(a, b)
}

func article(kind string) string {
	if strings.IndexByte("aeiou", kind[0]) >= 0 {
		return "an"
	}
	return "a"
}

func onText(on string) string {
	if on == "" {
		return ""
	}
	return " on " + on
}

// lookup returns the kind of the object named name ("" when there is
// none) and, for an index or a trigger, its table. trigger looks in
// SQLite's namespace of triggers (PostgreSQL's triggers are per table, and
// the schema replaces its own: not looked up), otherwise in the one of
// tables, indexes, sequences and views.
func lookup(ctx context.Context, q Querier, d sqldb.Dialect, name string, trigger bool) (kind, on string, err error) {
	if trigger {
		if d == sqldb.Postgres {
			return "", "", nil
		}
		err = q.QueryRowContext(ctx, `SELECT type, tbl_name FROM sqlite_master WHERE name = ? COLLATE NOCASE AND type = 'trigger'`, name).Scan(&kind, &on)
		if errors.Is(err, sql.ErrNoRows) {
			return "", "", nil
		}
		return kind, on, err
	}
	if d == sqldb.Postgres {
		var k string
		err = q.QueryRowContext(ctx, `SELECT c.relkind::text, COALESCE((SELECT t.relname::text FROM pg_index x JOIN pg_class t ON t.oid = x.indrelid WHERE x.indexrelid = c.oid), '')
	FROM pg_class c WHERE c.relname = $1 AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())`, name).Scan(&k, &on)
		if errors.Is(err, sql.ErrNoRows) {
			return "", "", nil
		}
		if err != nil {
			return "", "", err
		}
		switch k {
		case "r", "p": // a table; partitioned (the application's own migration)
			kind = Table
		case "i", "I":
			kind = Index
		case "S":
			kind = Sequence
		case "v":
			kind = "view"
		case "m":
			kind = "materialized view"
		case "f":
			kind = "foreign table"
		case "c":
			kind = "composite type"
		default:
			kind = "relation of kind " + k
		}
		return kind, on, nil
	}
	err = q.QueryRowContext(ctx, `SELECT type, tbl_name FROM sqlite_master WHERE name = ? COLLATE NOCASE AND type <> 'trigger'`, name).Scan(&kind, &on)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", nil
	}
	if err != nil {
		return "", "", err
	}
	if kind == Table || kind == "view" {
		on = ""
	}
	return kind, on, nil
}

// columns returns the columns of the table name.
func columns(ctx context.Context, q Querier, d sqldb.Dialect, name string) ([]string, error) {
	query := `SELECT name FROM pragma_table_info(?) ORDER BY cid`
	if d == sqldb.Postgres {
		query = `SELECT attname::text FROM pg_attribute WHERE attrelid = (SELECT c.oid FROM pg_class c WHERE c.relname = $1 AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())) AND attnum > 0 AND NOT attisdropped ORDER BY attnum`
	}
	rows, err := q.QueryContext(ctx, query, name)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var cols []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return nil, err
		}
		cols = append(cols, c)
	}
	return cols, rows.Err()
}

// Begin begins a CreateSchema's transaction: on PostgreSQL at READ
// COMMITTED whatever the default_transaction_isolation, so that each of
// Check's reads, made after Lock, sees the objects a concurrent CreateSchema
// committed while this one waited for the lock. (Under REPEATABLE READ or
// SERIALIZABLE the snapshot was the lock statement's, taken before the
// wait: the check found a name free that the other had just taken, and
// CREATE ... IF NOT EXISTS skipped the other's object without a word.)
func Begin(ctx context.Context, db *sql.DB, d sqldb.Dialect) (*sql.Tx, error) {
	var opts *sql.TxOptions
	if d == sqldb.Postgres {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	return db.BeginTx(ctx, opts)
}

// Lock takes, on PostgreSQL, the transaction-level advisory lock that makes
// concurrent CreateSchemas of the schema named after table take turns (a
// no-op on SQLite, whose write transactions are serialised): without it,
// of two concurrent CREATE TABLE IF NOT EXISTS of one name the later fails
// with a unique violation of the catalog (pg_type_typname_nsp_index), and
// two checks both find the names free. One lock per name for the outbox,
// the inbox and Versions, so that an outbox and an inbox given one name
// also take turns (and the later gets ErrSchemaConflict); its key is the
// one the outbox has always taken, so that an older version's CreateSchema
// running at once takes turns too.
func Lock(ctx context.Context, tx *sql.Tx, d sqldb.Dialect, table string) error {
	if d != sqldb.Postgres {
		return nil
	}
	_, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "keysched_outbox_schema:"+table)
	return err
}

// DerivedSuffix is WithTable's refusal of name when it ends in a suffix of
// sqldb.DerivedSuffixes (nil when it does not).
func DerivedSuffix(name string) *optcheck.Refusal {
	s := sqldb.DerivedSuffix(name)
	if s == "" {
		return nil
	}
	base := strings.TrimSuffix(name, s)
	return optcheck.Refuse("WithTable", strconv.Quote(name),
		"ends in %q, a suffix the outbox's and the inbox's schemas name their other tables and indexes with: an outbox or inbox named %q in the same database creates an object named %q (tables, indexes and sequences share one namespace), and CREATE ... IF NOT EXISTS would make the two share it; choose a name not ending in any of %s",
		s, base, name, strings.Join(sqldb.DerivedSuffixes, ", "))
}
