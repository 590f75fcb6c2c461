// Package sqldb holds what the outbox and inbox packages share about the two
// databases they run on: the SQL dialect, opening a database with the settings
// they need, and the small differences in SQL text between the two.
//
// Both databases are used through database/sql, so the caller's *sql.DB and
// *sql.Tx work with either:
//
//   - SQLite through modernc.org/sqlite (pure Go, no cgo), driver name
//     "sqlite": the embedded default, a file and no setup. OpenSQLite opens
//     one with WAL, a busy timeout and immediate transactions.
//   - PostgreSQL through github.com/jackc/pgx/v5 and its database/sql driver
//     (github.com/jackc/pgx/v5/stdlib), driver name "pgx". OpenPostgres opens
//     one from a DSN.
package sqldb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/keysched/keysched"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"
)

// Dialect names the SQL a store speaks.
type Dialect int

const (
	// Auto means "find out from the *sql.DB's driver" (pgx's stdlib driver
	// is PostgreSQL, modernc.org/sqlite is SQLite).
	Auto Dialect = iota
	// Postgres is PostgreSQL (tested on 15) through pgx's database/sql driver.
	Postgres
	// SQLite is SQLite (3.35 or newer, for RETURNING) through modernc.org/sqlite.
	SQLite
)

// String returns "auto", "postgres" or "sqlite".
func (d Dialect) String() string {
	switch d {
	case Auto:
		return "auto"
	case Postgres:
		return "postgres"
	case SQLite:
		return "sqlite"
	}
	return "Dialect(" + strconv.Itoa(int(d)) + ")"
}

// ErrUnknownDialect is returned when a dialect is neither Postgres nor SQLite,
// or when Detect cannot tell the dialect of a *sql.DB's driver.
var ErrUnknownDialect = errors.New("sqldb: unknown SQL dialect")

// Detect returns the dialect of db's driver: Postgres for pgx's stdlib driver,
// SQLite for modernc.org/sqlite. Any other driver gets ErrUnknownDialect: say
// the dialect explicitly then (WithDialect in the outbox and inbox packages).
func Detect(db *sql.DB) (Dialect, error) {
	if db == nil {
		return Auto, errors.New("sqldb: nil *sql.DB")
	}
	switch db.Driver().(type) {
	case *stdlib.Driver:
		return Postgres, nil
	case *sqlite.Driver:
		return SQLite, nil
	}
	return Auto, fmt.Errorf("%w: driver %T (say WithDialect(Postgres) or WithDialect(SQLite))", ErrUnknownDialect, db.Driver())
}

// ErrDialectMismatch is wrapped by Resolve's error for a dialect that
// contradicts the driver of the *sql.DB (every statement would fail with a
// syntax error).
var ErrDialectMismatch = errors.New("sqldb: dialect contradicts the database's driver")

// Resolve returns d, or Detect(db) when d is Auto; an invalid d is an error,
// and so is a d that contradicts a driver Detect recognises
// (ErrDialectMismatch).
func Resolve(db *sql.DB, d Dialect) (Dialect, error) {
	switch d {
	case Auto:
		return Detect(db)
	case Postgres, SQLite:
		if got, err := Detect(db); err == nil && got != d {
			return Auto, fmt.Errorf("%w: %v given for a %v database (driver %T)", ErrDialectMismatch, d, got, db.Driver())
		}
		return d, nil
	}
	return Auto, fmt.Errorf("%w: %v", ErrUnknownDialect, d)
}

// ErrInMemorySQLite is wrapped by OpenSQLite's error for an in-memory or
// temporary database (":memory:", "file::memory:" or its percent-encoded
// forms, mode=memory, an empty file: name, vfs=memdb on a name not
// beginning with "/"): SQLite gives each connection of the *sql.DB's pool
// its own such database, so a schema created on one connection is missing on the
// others, and rows written on one are not seen by the next. (Shared cache,
// cache=shared, would share it, but locks whole tables and fails concurrent
// writers with SQLITE_LOCKED at once, without the busy timeout.) For a
// throwaway database, open a file in a temporary directory (t.TempDir() in
// a test, os.MkdirTemp otherwise).
var ErrInMemorySQLite = errors.New("sqldb: in-memory SQLite database: each pooled connection would get its own empty database")

// The settings OpenSQLite adds: each is left out when the caller's name sets
// the same thing (a _pragma of that pragma, or the driver's shorthand key).
var sqliteDefaults = []struct {
	key, value string // the DSN parameter added
	pragma     string // the pragma it sets ("" for _txlock)
	shorthand  []string
}{
	{"_pragma", "busy_timeout(10000)", "busy_timeout", []string{"_busy_timeout", "_timeout"}},
	{"_pragma", "journal_mode(WAL)", "journal_mode", []string{"_journal_mode", "_journal"}},
	{"_pragma", "synchronous(NORMAL)", "synchronous", []string{"_synchronous", "_sync"}},
	{"_txlock", "immediate", "", nil},
}

// sqliteURIParams are the parameters SQLite itself reads, only from a file:
// URI (the driver reads vfs from any name): the core's, and the unix VFS's
// modeof and readonly_shm (a read-only -shm file of a WAL database).
var sqliteURIParams = map[string]bool{"mode": true, "cache": true, "immutable": true, "nolock": true, "psow": true, "modeof": true, "readonly_shm": true}

// sqliteDriverParams are the query parameters modernc.org/sqlite (v1.62)
// reads from any name, in its documentation's order: it ignores every other
// key without a word, upper-case ones included (_PRAGMA).
var sqliteDriverParams = []string{"_pragma", "_txlock", "_time_format", "_time_integer_format", "_timezone",
	"_inttotime", "_texttotime", "_busy_timeout", "_timeout", "_journal_mode", "_journal", "_synchronous", "_sync",
	"_foreign_keys", "_fk", "_auto_vacuum", "_vacuum", "_query_only", "_dqs", "_defensive", "_error_rc", "vfs"}

// ErrUnknownSQLiteParameter is wrapped by OpenSQLite's error for a query
// parameter that neither modernc.org/sqlite nor SQLite reads (a misspelt or
// upper-case key, or a plain file name with a "?" in it): the driver would
// ignore it and open the database without that setting. The error names the
// key and the keys accepted.
var ErrUnknownSQLiteParameter = errors.New("sqldb: SQLite query parameter that neither the driver nor SQLite reads")

// OpenSQLite opens (creating it if missing) the SQLite database file at path
// with the settings the outbox and inbox rely on: WAL journal (readers do not
// block the writer), synchronous=NORMAL (durable across a process crash; the
// last transactions may be lost on power loss, see SQLite's documentation),
// a 10 s busy timeout (writers queue instead of failing with SQLITE_BUSY), and
// immediate transactions (a transaction takes the write lock when it begins,
// so two transactions never deadlock upgrading from read to write).
//
// path is a file name ("app.db", "/var/lib/app/app.db") or a SQLite URI
// ("file:app.db?mode=ro", "file:///var/lib/app/app.db"), with or without a
// query string of modernc.org/sqlite's parameters. OpenSQLite merges the
// caller's parameters with its own (the caller's query string is passed on
// as written, its own appended): each of its settings is added unless the
// caller's query sets the same thing (a _pragma of the same pragma, such as
// _pragma=synchronous(FULL), or the driver's shorthand, such as
// _busy_timeout=5000; _txlock), and then the caller's wins. A caller's
// setting that weakens one above (a busy timeout of 0, deferred
// transactions) weakens what the outbox and inbox rely on. SQLite's own URI
// parameters (mode, cache, immutable, nolock, psow, modeof, readonly_shm) are read only
// from a file: URI: on a plain file name ("app.db?mode=ro") SQLite would
// ignore them, so OpenSQLite refuses them there, saying to write
// "file:app.db?mode=ro". A query string that does not parse is an error.
// So is a key that neither the driver nor SQLite reads (a misspelt key, an
// upper-case one such as _PRAGMA: both would be ignored), wrapping
// ErrUnknownSQLiteParameter, naming the key and the keys read: the driver's
// (_pragma, _txlock, _time_format, _busy_timeout, vfs, ... as in
// modernc.org/sqlite v1.62) and, on a file: URI, SQLite's. On a plain file
// name the first "?" begins the query string, as for the driver: a file
// whose name has a "?" in it is named by its file: URI, "?" written %3F
// ("file:a%3Fb.db" is the file a?b.db); "a?b.db" is refused (b.db is no
// key), and the error gives that URI.
//
// In-memory and temporary databases (":memory:", "file::memory:",
// mode=memory, an empty file: name, vfs=memdb on a name not beginning with
// "/") are refused with an error wrapping
// ErrInMemorySQLite: each pooled connection would get its own database (see
// ErrInMemorySQLite); use a file in a temporary directory.
//
// SQLite has one writer at a time: every write transaction of the process
// (and of other processes on the same file) runs one after another.
func OpenSQLite(path string) (*sql.DB, error) {
	dsn, err := sqliteDSN(path)
	if err != nil {
		return nil, err
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("sqldb: open SQLite %s: %w", path, err)
	}
	if err := db.PingContext(context.Background()); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqldb: open SQLite %s: %w", path, err)
	}
	return db, nil
}

// sqliteDSN is OpenSQLite's DSN for path: the caller's name and parameters
// with OpenSQLite's settings merged in, or an error saying why path is
// refused.
func sqliteDSN(path string) (string, error) {
	name, query, _ := strings.Cut(path, "?")
	if name == "" {
		return "", fmt.Errorf("sqldb: open SQLite %q: empty path", path)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return "", fmt.Errorf("sqldb: open SQLite %q: query string: %w", path, err)
	}
	uri := strings.HasPrefix(name, "file:")
	file := name
	if uri {
		// file:name, file:/abs, file:///abs, file://localhost/abs.
		file = strings.TrimPrefix(name, "file:")
		if rest, ok := strings.CutPrefix(file, "//"); ok {
			if i := strings.IndexByte(rest, '/'); i >= 0 {
				file = rest[i:]
			} else {
				file = ""
			}
		}
	}
	memory := false
	if uri {
		// SQLite decodes a URI's name: file:%3Amemory%3A is :memory:.
		if f, err := url.PathUnescape(file); err == nil {
			file = f
		}
		// SQLite reads every mode given, the last one winning.
		for _, m := range q["mode"] {
			memory = memory || strings.EqualFold(m, "memory")
		}
	}
	// The memdb VFS (read by the driver from any name) gives each
	// connection its own database unless the name begins with "/".
	for _, v := range q["vfs"] {
		memory = memory || (v == "memdb" && !strings.HasPrefix(file, "/"))
	}
	switch {
	case file == ":memory:" || memory:
		return "", fmt.Errorf("sqldb: open SQLite %q: %w (SQLite gives every connection of a pool its own in-memory database: a schema created on one is missing on the others); open a file in a temporary directory instead (t.TempDir() in tests)", path, ErrInMemorySQLite)
	case uri && file == "":
		return "", fmt.Errorf("sqldb: open SQLite %q: %w (an empty file: name is a temporary database, private to each connection); open a file in a temporary directory instead (t.TempDir() in tests)", path, ErrInMemorySQLite)
	}
	if !uri {
		for k := range q {
			if sqliteURIParams[k] {
				return "", fmt.Errorf("sqldb: open SQLite %q: SQLite reads the parameter %s only from a file: URI and would ignore it here: write %q", path, k, fileURI(name)+"?"+query)
			}
		}
	}
	if err := unknownSQLiteParams(path, name, uri, q); err != nil {
		return "", err
	}
	// The caller's query string is kept as written (SQLite decodes a
	// file: URI's parameters itself, and reads "+" as "+", not a space),
	// OpenSQLite's settings appended.
	add := url.Values{}
	set := map[string]bool{}
	for _, p := range q["_pragma"] {
		n := strings.ToLower(strings.TrimSpace(p))
		if i := strings.IndexAny(n, "(= "); i >= 0 {
			n = n[:i]
		}
		n = n[strings.LastIndexByte(n, '.')+1:] // main.journal_mode
		set[n] = true
	}
	for _, d := range sqliteDefaults {
		given := q.Has(d.key) && d.pragma == ""
		given = given || (d.pragma != "" && set[d.pragma])
		for _, k := range d.shorthand {
			given = given || q.Has(k)
		}
		if !given {
			add.Add(d.key, d.value)
		}
	}
	if query != "" && len(add) > 0 {
		query += "&"
	}
	return name + "?" + query + add.Encode(), nil
}

// unknownSQLiteParams refuses, with ErrUnknownSQLiteParameter, a key of q
// that neither the driver nor (on a file: URI) SQLite reads.
func unknownSQLiteParams(path, name string, uri bool, q url.Values) error {
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if slices.Contains(sqliteDriverParams, k) || uri && sqliteURIParams[k] {
			continue
		}
		accepted := strings.Join(sqliteDriverParams, ", ")
		if uri {
			accepted += " and SQLite's mode, cache, immutable, nolock, psow, modeof, readonly_shm"
		}
		hint := ""
		if l := strings.ToLower(k); l != k && (slices.Contains(sqliteDriverParams, l) || uri && sqliteURIParams[l]) {
			hint = fmt.Sprintf(" (keys are case-sensitive: write %s)", l)
		}
		if !uri && hint == "" {
			hint = fmt.Sprintf("; the first \"?\" ends a plain file name: for a file named %q, write %q", path, fileURI(path))
		}
		return fmt.Errorf("sqldb: open SQLite %q: %w: %q, which would be ignored%s; the keys read are %s", path, ErrUnknownSQLiteParameter, k, hint, accepted)
	}
	return nil
}

// fileURI is the file: URI of the plain file name name: SQLite decodes a
// URI's name and ends it at "?" or "#", so "%", "?" and "#" are escaped,
// and reads "file://host/..." as an authority, so a name beginning with
// "//" gets an empty one.
func fileURI(name string) string {
	name = strings.NewReplacer("%", "%25", "?", "%3F", "#", "%23").Replace(name)
	if strings.HasPrefix(name, "//") {
		return "file://" + name
	}
	return "file:" + name
}

// OpenPostgres opens a PostgreSQL database through pgx's database/sql driver
// and checks that it answers (within ctx). dsn is a URL
// (postgres://user@host/db?sslmode=disable) or a key=value string
// (host=/var/run/postgresql dbname=app), as pgx accepts. A nil ctx gets
// keysched.ErrNilContext.
func OpenPostgres(ctx context.Context, dsn string) (*sql.DB, error) {
	if ctx == nil {
		return nil, fmt.Errorf("sqldb: open PostgreSQL: %w", keysched.ErrNilContext)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("sqldb: open PostgreSQL: %w", err)
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqldb: open PostgreSQL: %w", err)
	}
	return db, nil
}

// Rebind turns a query written with ? placeholders into the dialect's form:
// $1, $2, ... for PostgreSQL, unchanged for SQLite. It does not look inside
// string literals: the package's queries have no ? in them.
func Rebind(d Dialect, query string) string {
	if d != Postgres {
		return query
	}
	var b strings.Builder
	b.Grow(len(query) + 8)
	n := 0
	for i := 0; i < len(query); i++ {
		if query[i] == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(query[i])
	}
	return b.String()
}

// ValidIdent reports whether name can be used as a table name unquoted and
// extended with a suffix: a lower-case letter or underscore, then lower-case
// letters, digits or underscores, at most 48 bytes (PostgreSQL's limit is 63,
// and the packages derive index and table names from it), and not a
// reserved word (see Reserved). No schema qualifier: on PostgreSQL, choose
// the schema with the connection's search_path.
func ValidIdent(name string) bool {
	if name == "" || len(name) > 48 || Reserved(name) {
		return false
	}
	for i, c := range name {
		switch {
		case c == '_', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// Reserved reports whether name is one of the 118 keywords of PostgreSQL 15
// or SQLite, or system_user (reserved since PostgreSQL 16), that the
// outbox's and inbox's statements cannot use unquoted as a table's name
// ("select", "order", "user", "table", "index", ...): their CreateSchema
// would fail with a syntax error. Other keywords ("key", "type", "data",
// "action") work on both. The list was built by running the
// statements with each keyword of both databases
// (outbox.TestWithTableRefusesTheKeywordsTheSchemaCannotUse), lower case
// only (as ValidIdent's names are).
func Reserved(name string) bool { return reservedWords[name] }

var reservedWords = map[string]bool{
	"add": true, "all": true, "alter": true, "analyse": true, "analyze": true, "and": true,
	"any": true, "array": true, "as": true, "asc": true, "asymmetric": true,
	"authorization": true, "autoincrement": true, "between": true, "binary": true, "both": true,
	"case": true, "cast": true, "check": true, "collate": true, "collation": true,
	"column": true, "commit": true, "concurrently": true, "constraint": true, "create": true,
	"cross": true, "current_catalog": true, "current_date": true, "current_role": true,
	"current_schema": true, "current_time": true, "current_timestamp": true,
	"current_user": true, "default": true, "deferrable": true, "delete": true, "desc": true,
	"distinct": true, "do": true, "drop": true, "else": true, "end": true, "escape": true,
	"except": true, "exists": true, "false": true, "fetch": true, "for": true, "foreign": true,
	"freeze": true, "from": true, "full": true, "grant": true, "group": true, "having": true,
	"if": true, "ilike": true, "in": true, "index": true, "initially": true, "inner": true,
	"insert": true, "intersect": true, "into": true, "is": true, "isnull": true, "join": true,
	"lateral": true, "leading": true, "left": true, "like": true, "limit": true,
	"localtime": true, "localtimestamp": true, "natural": true, "not": true, "nothing": true,
	"notnull": true, "null": true, "offset": true, "on": true, "only": true, "or": true,
	"order": true, "outer": true, "overlaps": true, "placing": true, "primary": true,
	"raise": true, "references": true, "returning": true, "right": true, "select": true,
	"session_user": true, "set": true, "similar": true, "some": true, "symmetric": true,
	"system_user": true, "table": true, "tablesample": true, "then": true, "to": true, "trailing": true,
	"transaction": true, "true": true, "union": true, "unique": true, "update": true,
	"user": true, "using": true, "values": true, "variadic": true, "verbose": true, "when": true,
	"where": true, "window": true, "with": true,
}

// IsUniqueViolation reports whether err is a uniqueness violation: SQLSTATE
// 23505 on PostgreSQL, SQLITE_CONSTRAINT_UNIQUE or _PRIMARYKEY on SQLite.
func IsUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "23505"
	}
	var sqErr *sqlite.Error
	if errors.As(err, &sqErr) {
		// SQLITE_CONSTRAINT_PRIMARYKEY = 1555, SQLITE_CONSTRAINT_UNIQUE = 2067.
		return sqErr.Code() == 1555 || sqErr.Code() == 2067
	}
	return false
}

// sqliteNoColumn reports whether m, an SQLITE_ERROR's text, says a column is
// missing: "no such column: x" (a read or an UPDATE), "table t has no column
// named x" (an INSERT's column list).
func sqliteNoColumn(m string) bool {
	return strings.Contains(m, "no such column") || strings.Contains(m, "has no column named")
}

// IsUndefinedColumn reports whether err says a statement named a column the
// table does not have: SQLSTATE 42703 on PostgreSQL, SQLITE_ERROR "no such
// column" or "has no column named" on SQLite (a schema older than the
// statement).
func IsUndefinedColumn(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "42703"
	}
	var sqErr *sqlite.Error
	if errors.As(err, &sqErr) {
		return sqErr.Code()&0xff == 1 && sqliteNoColumn(sqErr.Error())
	}
	return false
}

// IsRetryable reports whether err is a transient conflict that the same
// statement may well pass on a second try: a PostgreSQL deadlock (40P01) or
// serialization failure (40001), SQLite's SQLITE_BUSY or SQLITE_LOCKED.
func IsRetryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "40P01" || pgErr.Code == "40001"
	}
	var sqErr *sqlite.Error
	if errors.As(err, &sqErr) {
		c := sqErr.Code() & 0xff
		return c == 5 || c == 6
	}
	return false
}

// Now returns the current time as the packages store it: UTC, truncated to
// microseconds (PostgreSQL's timestamp precision), so a time read back from
// either database equals the one written.
func Now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// CheckText checks a string bound for a TEXT column that must read back as
// written on both databases: at most max bytes, no NUL byte, valid UTF-8
// (PostgreSQL's TEXT refuses NUL and invalid UTF-8 with a database error;
// SQLite would store them). The error names field and says what is wrong;
// callers wrap their package's sentinel around it.
func CheckText(field, v string, max int) error {
	switch {
	case len(v) > max:
		return fmt.Errorf("%s of %d bytes (at most %d)", field, len(v), max)
	case strings.ContainsRune(v, 0):
		return fmt.Errorf("%s %q: NUL byte", field, v)
	case !utf8.ValidString(v):
		return fmt.Errorf("%s %q: invalid UTF-8", field, v)
	}
	return nil
}

// StorableText returns s as a TEXT column of both databases stores it and
// reads it back: each invalid UTF-8 sequence and each NUL byte becomes
// U+FFFD (PostgreSQL's TEXT refuses both). For text the caller does not
// control (an error's message, a response body), where CheckText would
// refuse it.
func StorableText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// An ErrorKind classes a database error by what the caller can expect of a
// retry. See Classify.
type ErrorKind int

// The kinds of database errors.
const (
	// KindOther is any error of no other kind (a constraint, a syntax
	// error, a full disk): a retry is unlikely to help until something
	// changes.
	KindOther ErrorKind = iota
	// KindConnection: the connection could not be made or broke (the
	// server is restarting, down or unreachable, the backend was
	// terminated, too many connections). A retry on a new connection
	// passes once the server is back.
	KindConnection
	// KindTimeout: a statement ran out of time (PostgreSQL's
	// statement_timeout or lock_timeout, SQLSTATE 57014 or 55P03, or a
	// context deadline).
	KindTimeout
	// KindConflict: a transient conflict with another transaction
	// (IsRetryable: a deadlock, a serialization failure, SQLite busy or
	// locked).
	KindConflict
	// KindSchema: a table or column is missing (the schema was not
	// created, or is older than the code).
	KindSchema
	// KindStorage: the database cannot write: a read-only database (a
	// PostgreSQL hot standby after a failover went the wrong way, SQLSTATE
	// 25006; a read-only SQLite file, SQLITE_READONLY or SQLITE_CANTOPEN),
	// a failing or full disk (SQLITE_IOERR, SQLITE_FULL, PostgreSQL's
	// 53100 disk_full and 58030 io_error).
	KindStorage
	numKinds
)

// NumErrorKinds is the number of ErrorKind values (KindOther is 0).
const NumErrorKinds = int(numKinds)

// String returns "other", "connection", "timeout", "conflict", "schema" or
// "storage".
func (k ErrorKind) String() string {
	switch k {
	case KindOther:
		return "other"
	case KindConnection:
		return "connection"
	case KindTimeout:
		return "timeout"
	case KindConflict:
		return "conflict"
	case KindSchema:
		return "schema"
	case KindStorage:
		return "storage"
	}
	return "ErrorKind(" + strconv.Itoa(int(k)) + ")"
}

// ErrDBClosed is wrapped (see WrapDBClosed) around database/sql's error for
// a call on a *sql.DB whose Close was called ("sql: database is closed"):
// no call on it can succeed again, so it is no outage to wait out. The
// outbox and inbox wrap it around that error wherever they return it, and
// an outbox relay's Run returns it at once.
var ErrDBClosed = errors.New("sqldb: the *sql.DB was closed (its Close was called): no call on it can succeed")

// ErrSchemaConflict is wrapped by the outbox's and the inbox's CreateSchema
// error when a name their schema creates is taken by another object: a
// table without the columns the schema needs (another outbox's lease
// table, an inbox's table, the application's), an index or trigger of
// another table, an object of another kind. CREATE ... IF NOT EXISTS would
// skip it without a word, and the outbox or inbox would run on the foreign
// object. The error names the object, what holds the name and what is
// needed.
var ErrSchemaConflict = errors.New("sqldb: a name the schema creates is taken by another object")

// DerivedSuffixes are the suffixes the outbox's and the inbox's schemas add
// to their table's name to name their other tables, indexes and sequences,
// which share one namespace with tables (on PostgreSQL and on SQLite),
// longest first. WithTable refuses a name ending in one (see
// DerivedSuffix). The names of triggers and functions (<table>_notify,
// <table>_lease_epoch_insert, ...) are in namespaces of their own, and two
// tables' never meet.
var DerivedSuffixes = []string{
	"_processed_at", // inbox: index
	"_lease_epoch",  // outbox: sequence (PostgreSQL), table (SQLite)
	"_lease_owner",  // outbox: index on <table>_lease
	"_pending_key",  // outbox: index
	"_lease",        // outbox: lease table
	"_idle",         // outbox, PostgreSQL: idle relays' table
	"_dead",         // outbox: index
	"_sent",         // outbox: index
}

// DerivedSuffix returns the suffix of DerivedSuffixes that name ends in
// ("" when none): a table of that name would share its name with an object
// that the outbox or inbox named by the rest of it creates (an outbox
// "x_lease" and the lease table of an outbox "x"), and each one's CREATE
// ... IF NOT EXISTS would then skip the other's object and run on it.
func DerivedSuffix(name string) string {
	for _, s := range DerivedSuffixes {
		if strings.HasSuffix(name, s) {
			return s
		}
	}
	return ""
}

// sqlDBClosed is database/sql's error text for a call on a closed *sql.DB
// (its error value is unexported).
const sqlDBClosed = "sql: database is closed"

// IsDBClosed reports whether err is, or wraps, database/sql's error for a
// call on a closed *sql.DB ("sql: database is closed", matched by its text:
// database/sql does not export it), or wraps ErrDBClosed.
func IsDBClosed(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrDBClosed) || err.Error() == sqlDBClosed {
		return true
	}
	if u := errors.Unwrap(err); u != nil {
		return IsDBClosed(u)
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok { // errors.Join, fmt.Errorf with several %w
		for _, e := range j.Unwrap() {
			if IsDBClosed(e) {
				return true
			}
		}
	}
	return false
}

// WrapDBClosed returns err wrapped with ErrDBClosed when it is database/sql's
// error for a closed *sql.DB (IsDBClosed) and does not wrap ErrDBClosed
// already; otherwise err as is (nil for nil). The error keeps err's text
// after ErrDBClosed's, and errors.Is finds both.
func WrapDBClosed(err error) error {
	if !IsDBClosed(err) || errors.Is(err, ErrDBClosed) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrDBClosed, err)
}

// Classify returns the kind of a database error from either driver (nil is
// KindOther). A context.Canceled error is KindOther: the caller gave up. A
// call on a closed *sql.DB is KindOther too (IsDBClosed): no retry passes.
func Classify(err error) ErrorKind {
	if err == nil {
		return KindOther
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch c := pgErr.Code; {
		case strings.HasPrefix(c, "08"), // connection exception
			c == "57P01", c == "57P02", c == "57P03", // admin shutdown, crash shutdown, cannot connect now
			c == "53300": // too many connections
			return KindConnection
		case c == "57014", c == "55P03": // query canceled (statement_timeout), lock_not_available (lock_timeout)
			return KindTimeout
		case c == "40P01", c == "40001":
			return KindConflict
		case c == "42P01", c == "42703", c == "3F000": // undefined table, column, schema
			return KindSchema
		case c == "25006", c == "53100", c == "58030": // read_only_sql_transaction, disk_full, io_error
			return KindStorage
		}
		return KindOther
	}
	var sqErr *sqlite.Error
	if errors.As(err, &sqErr) {
		switch sqErr.Code() & 0xff {
		case 5, 6: // SQLITE_BUSY, SQLITE_LOCKED
			return KindConflict
		case 8, 10, 13, 14: // SQLITE_READONLY, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN
			return KindStorage
		case 1:
			if m := sqErr.Error(); strings.Contains(m, "no such table") || sqliteNoColumn(m) {
				return KindSchema
			}
		}
		return KindOther
	}
	if errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) {
		return KindTimeout
	}
	var connErr *pgconn.ConnectError
	var netErr net.Error
	if errors.As(err, &connErr) || errors.As(err, &netErr) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		strings.Contains(err.Error(), "conn closed") {
		return KindConnection
	}
	return KindOther
}
