package outbox

import (
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/keysched/keysched/db/internal/schemacheck"
	"github.com/keysched/keysched/db/sqldb"
)

// schema returns the DDL for the dialect. Times are TIMESTAMPTZ on
// PostgreSQL and INTEGER microseconds since the Unix epoch (UTC) on SQLite.
// notify says whether PostgreSQL's schema ends with the NOTIFY trigger
// (created or replaced) or without it (dropped if there).
func schema(d Dialect, t string, notify bool) []string {
	if d == Postgres {
		return append([]string{
			`CREATE TABLE IF NOT EXISTS ` + t + ` (
	seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id         TEXT NOT NULL UNIQUE,
	key        TEXT NOT NULL,
	type       TEXT NOT NULL,
	payload    BYTEA NOT NULL,
	headers    TEXT,
	created_at TIMESTAMPTZ NOT NULL,
	state      SMALLINT NOT NULL DEFAULT 0,
	attempts   INTEGER NOT NULL DEFAULT 0,
	last_error TEXT,
	done_at    TIMESTAMPTZ
)`,
			`CREATE INDEX IF NOT EXISTS ` + t + `_pending_key ON ` + t + ` (key, seq) WHERE state = 0`,
			`CREATE INDEX IF NOT EXISTS ` + t + `_dead ON ` + t + ` (key, seq) WHERE state = 2`,
			`CREATE INDEX IF NOT EXISTS ` + t + `_sent ON ` + t + ` (done_at) WHERE state = 1`,
			`CREATE TABLE IF NOT EXISTS ` + t + `_lease (
	key        TEXT PRIMARY KEY,
	owner      TEXT NOT NULL,
	expires_at TIMESTAMPTZ NOT NULL,
	token      TEXT,
	epoch      BIGINT NOT NULL DEFAULT 0
)`,
			// A lease table created before the token column (idempotent).
			`ALTER TABLE ` + t + `_lease ADD COLUMN IF NOT EXISTS token TEXT`,
			// Each claim's epoch: one counter per outbox, so that a key's
			// epoch grows across claims even when its lease row was
			// deleted (released) in between. Created before the column,
			// which Run's probe checks, and dropped with the lease table.
			`CREATE SEQUENCE IF NOT EXISTS ` + t + `_lease_epoch`,
			// A lease table created before the epoch column (idempotent).
			`ALTER TABLE ` + t + `_lease ADD COLUMN IF NOT EXISTS epoch BIGINT NOT NULL DEFAULT 0`,
			`ALTER SEQUENCE ` + t + `_lease_epoch OWNED BY ` + t + `_lease.epoch`,
			`CREATE INDEX IF NOT EXISTS ` + t + `_lease_owner ON ` + t + `_lease (owner)`,
			// The relays idle and listening: the NOTIFY trigger notifies
			// only while one has a live row here (see notifyTrigger).
			// Unlogged: empty after a crash or on a promoted standby, where
			// relays only poll until they find themselves idle again.
			`CREATE UNLOGGED TABLE IF NOT EXISTS ` + t + `_idle (
	token TEXT PRIMARY KEY,
	until TIMESTAMPTZ NOT NULL
)`,
		}, notifyTrigger(t, notify)...)
	}
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + t + ` (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	id         TEXT NOT NULL UNIQUE,
	key        TEXT NOT NULL,
	type       TEXT NOT NULL,
	payload    BLOB NOT NULL,
	headers    TEXT,
	created_at INTEGER NOT NULL,
	state      INTEGER NOT NULL DEFAULT 0,
	attempts   INTEGER NOT NULL DEFAULT 0,
	last_error TEXT,
	done_at    INTEGER
)`,
		`CREATE INDEX IF NOT EXISTS ` + t + `_pending_key ON ` + t + ` (key, seq) WHERE state = 0`,
		`CREATE INDEX IF NOT EXISTS ` + t + `_dead ON ` + t + ` (key, seq) WHERE state = 2`,
		`CREATE INDEX IF NOT EXISTS ` + t + `_sent ON ` + t + ` (done_at) WHERE state = 1`,
		`CREATE TABLE IF NOT EXISTS ` + t + `_lease (
	key        TEXT PRIMARY KEY,
	owner      TEXT NOT NULL,
	expires_at INTEGER NOT NULL,
	token      TEXT,
	epoch      INTEGER NOT NULL DEFAULT 0
)`,
		`CREATE INDEX IF NOT EXISTS ` + t + `_lease_owner ON ` + t + `_lease (owner)`,
		// Each claim's epoch: one counter per outbox (one row), so that a
		// key's epoch grows across claims even when its lease row was
		// deleted (released) in between. A claim computes its epochs from
		// the counter and the triggers move the counter up to them, so
		// that a claim is one statement (SQLite's write lock is held for
		// one statement, not a transaction's round trips).
		`CREATE TABLE IF NOT EXISTS ` + t + `_lease_epoch (id INTEGER PRIMARY KEY CHECK (id = 1), n INTEGER NOT NULL)`,
		`INSERT OR IGNORE INTO ` + t + `_lease_epoch (id, n) VALUES (1, 0)`,
		`CREATE TRIGGER IF NOT EXISTS ` + t + `_lease_epoch_insert AFTER INSERT ON ` + t + `_lease
BEGIN UPDATE ` + t + `_lease_epoch SET n = max(n, NEW.epoch) WHERE id = 1; END`,
		`CREATE TRIGGER IF NOT EXISTS ` + t + `_lease_epoch_update AFTER UPDATE OF epoch ON ` + t + `_lease
BEGIN UPDATE ` + t + `_lease_epoch SET n = max(n, NEW.epoch) WHERE id = 1; END`,
	}
}

// schemaObjects are the objects schema creates that CreateSchema checks
// first (schemacheck: a name taken by anything else is refused rather than
// skipped by IF NOT EXISTS): the tables with the columns the code reads
// that no ALTER of the schema adds, the indexes and (SQLite) triggers on
// their tables, the epoch sequence and the NOTIFY trigger's function
// (PostgreSQL).
func schemaObjects(d Dialect, t string) []schemacheck.Object {
	l := t + "_lease"
	objs := []schemacheck.Object{
		{Name: t, Kind: schemacheck.Table, Columns: []string{"seq", "id", "key", "type", "payload", "headers", "created_at", "state", "attempts", "last_error", "done_at"}},
		{Name: t + "_pending_key", Kind: schemacheck.Index, On: t},
		{Name: t + "_dead", Kind: schemacheck.Index, On: t},
		{Name: t + "_sent", Kind: schemacheck.Index, On: t},
		{Name: l, Kind: schemacheck.Table, Columns: []string{"key", "owner", "expires_at"}},
		{Name: l + "_owner", Kind: schemacheck.Index, On: l},
	}
	if d == Postgres {
		return append(objs,
			schemacheck.Object{Name: l + "_epoch", Kind: schemacheck.Sequence},
			schemacheck.Object{Name: t + "_idle", Kind: schemacheck.Table, Columns: []string{"token", "until"}},
			// Replaced, or dropped without the trigger: every version's
			// body notifies the table's channel.
			schemacheck.Object{Name: t + "_notify", Kind: schemacheck.Function, Source: "pg_notify('" + t + "'"})
	}
	return append(objs,
		schemacheck.Object{Name: l + "_epoch", Kind: schemacheck.Table, Columns: []string{"id", "n"}},
		schemacheck.Object{Name: l + "_epoch_insert", Kind: schemacheck.Trigger, On: l},
		schemacheck.Object{Name: l + "_epoch_update", Kind: schemacheck.Trigger, On: l})
}

// notifyTrigger returns PostgreSQL's statements that create (or replace) the
// trigger that NOTIFYs relays of a committed insert, at most one
// notification per transaction, or that drop it and its function. Both are
// idempotent, and switching either way is one CreateSchema.
//
// The cost of a notification: a transaction that has called pg_notify
// takes, at commit, a lock that serialises every notifying commit of the
// whole server (PostgreSQL's async.c, PreCommit_Notify, held until after the
// commit record is flushed), so concurrent writers lose group commit. So the
// trigger notifies only while a relay is idle and listening (a live row in
// <t>_idle, which a relay writes when a poll finds nothing and deletes when
// it finds rows again): a busy relay polls, and the writers' commits do not
// take the lock. The check is one read of that small table per transaction,
// at its first inserting statement, with that statement's snapshot: the
// transaction-local setting keysched_notify.<t> (set_config, undone at the
// transaction's end or by a rollback to a savepoint taken before it) says
// that this transaction has checked, so its later inserting statements only
// read the setting. (Checked at every statement, the read, a query through
// SPI with a snapshot of its own, made outboxbench's INSERT about twice as
// slow as without the trigger on a loaded machine.) A notification is sent
// at most once per transaction anyway: PostgreSQL folds a transaction's
// identical notifications into one.
func notifyTrigger(t string, on bool) []string {
	if !on {
		return []string{
			`DROP TRIGGER IF EXISTS ` + t + `_notify ON ` + t,
			`DROP FUNCTION IF EXISTS ` + t + `_notify()`,
		}
	}
	g := notifyCheckedSetting(t)
	return []string{
		`CREATE OR REPLACE FUNCTION ` + t + `_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
	checked text;
BEGIN
	IF current_setting('` + g + `', true) IS DISTINCT FROM 'y' THEN
		checked := set_config('` + g + `', 'y', true);
		IF EXISTS (SELECT 1 FROM ` + t + `_idle WHERE until > now()) THEN
			PERFORM pg_notify('` + t + `', '');
		END IF;
	END IF;
	RETURN NULL;
END
$$`,
		`CREATE OR REPLACE TRIGGER ` + t + `_notify AFTER INSERT ON ` + t + `
	FOR EACH STATEMENT EXECUTE FUNCTION ` + t + `_notify()`,
	}
}

// notifyCheckedSetting is the transaction-local setting by which table t's
// NOTIFY trigger remembers that the transaction has checked the idle table:
// keysched_notify.<t>, a custom setting (t is [a-z_][a-z0-9_]*, WithTable's
// rule, so the name is valid).
func notifyCheckedSetting(t string) string { return "keysched_notify." + t }

// sqliteAddColumns are the columns that CreateSchema adds to a SQLite lease
// table created before them (it checks that each is missing first: SQLite
// has no ADD COLUMN IF NOT EXISTS), in order.
func sqliteAddColumns(t string) [][2]string {
	return [][2]string{
		{"token", `ALTER TABLE ` + t + `_lease ADD COLUMN token TEXT`},
		{"epoch", `ALTER TABLE ` + t + `_lease ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0`},
	}
}

// queries holds the dialect's statements, with placeholders already in the
// dialect's form.
type queries struct {
	d     Dialect
	table string

	insert       string
	insertNotify string // Postgres, WithNotifyFromWrite: insert, notifying while a relay is idle

	listDead, parkedKeys, moveDead, hasDead, countStates string
	skipEvent, deadHead                                  string
	lookup                                               string

	// relay. Every statement on a claim names it by its key and epoch
	// (with the relay's owner name and token) and affects nothing under
	// another claim.
	renew, release, releaseAll     string // SQLite: a prefix; the (key, epoch) list is appended
	releaseOthers                  string // WithTakeOverOnStart
	candidates, candidatesPark     string
	acquireInsert, acquireTakeover string // Postgres
	acquireUpsert                  string // SQLite: %s is the VALUES list (key, owner, token, i)
	fetch                          string
	fetchPark                      string // fetch, nothing of a key with a dead row
	markSentDelete, markSentUpdate string // SQLite: a prefix; the (seq, epoch) list and markSentSuffix are appended
	markSentSuffix                 string
	probeColumns                   string // fails when the lease table lacks the token or epoch column
	probeTable                     string // fails when the outbox table is missing
	probeEpoch                     string // fails when the epoch counter (a sequence, a table on SQLite) is missing
	markDead, cleanup              string
	listenChannel                  string
	idle, busy                     string // Postgres: a relay's row in <table>_idle written, deleted
}

const rowCols = `seq, id, key, type, payload, headers, created_at, attempts`

// A lease's expiry is computed by the database, from its own clock when the
// statement that writes it runs, after the statement got its locks: a claim
// or a renewal that waited for a lock (SQLite's write lock, held by an
// application's transaction or another relay, for up to the busy timeout;
// on PostgreSQL a table lock, or for a renewal a lease row locked by a mark
// or a takeover) writes a lease of the full duration from then, not one
// shortened by the wait, or already expired. The relay's local deadline
// runs from before the statement was sent, so it ends no later than the
// expiry written. On PostgreSQL that clock is clock_timestamp(), read when
// the expression is evaluated: after the statement's table locks, and for a
// renewal after its lease rows' locks (FOR UPDATE, before the SET is
// computed); a takeover waits for no row (SKIP LOCKED). now() is the
// transaction's start, before any wait; statement_timestamp() is when the
// last protocol message came (Execute: after a table lock taken at Bind in
// the extended protocol, but before the row locks taken while the statement
// runs, and in the simple protocol before any wait), so it would not do
// (TestRenewalWaitingForALockWritesAFullLease/postgres_row_lock fails with
// it).
// One wait is not covered: a claim's INSERT of a key that another relay's
// claim inserted and has not committed computes its row, then waits for
// that claim; if it commits, the key is not claimed (DO NOTHING), and only
// if it rolls back is the row written, its lease short by that wait (the
// other claim's statement).
//
// sqliteNow is SQLite's clock in Unix microseconds: julianday('now'), which
// SQLite reads once per statement execution (every use within a statement
// sees one value), after the statement took the write lock, in whole
// milliseconds, truncated. sqliteExpiry is a lease's expiry from that clock
// (? is the lease in microseconds), the moment rounded up to the next
// millisecond so that it is never earlier than the real moment plus the
// lease. julianday, not unixepoch('subsec'), so that SQLite before 3.42
// (another driver, under WithDialect) runs it too.
const (
	sqliteNow    = `(CAST(round((julianday('now') - 2440587.5) * 86400000) AS INTEGER) * 1000)`
	sqliteExpiry = `(` + sqliteNow + ` + 1000 + ?)`
)

func newQueries(d Dialect, t string) queries {
	r := func(s string) string { return sqldb.Rebind(d, s) }
	l := t + "_lease"
	q := queries{d: d, table: t}
	q.insert = r(`INSERT INTO ` + t + ` (id, key, type, payload, headers, created_at) VALUES (?, ?, ?, ?, ?, ?)`)
	// WithNotifyFromWrite (PostgreSQL): the INSERT, and a notification
	// queued while a relay is idle, in one statement. A data-modifying CTE
	// runs to completion whether or not the outer SELECT reads it or
	// returns a row (TestNotifyFromWriteInsertsWhenNoRelayIsIdle). pg_notify
	// runs at most once (LIMIT 1), and a transaction's identical
	// notifications are folded into one anyway.
	q.insertNotify = `WITH ins AS (INSERT INTO ` + t + ` (id, key, type, payload, headers, created_at) VALUES ($1, $2, $3, $4, $5, $6))
SELECT pg_notify('` + t + `', '') FROM ` + t + `_idle WHERE until > now() LIMIT 1`
	q.listDead = r(`SELECT seq, id, key, type, payload, headers, created_at, attempts, last_error, done_at FROM ` + t + ` WHERE state = 2 ORDER BY seq LIMIT ?`)
	q.parkedKeys = `SELECT DISTINCT key FROM ` + t + ` WHERE state = 2 ORDER BY key`
	q.moveDead = r(`UPDATE ` + t + ` SET state = ? WHERE seq = (SELECT MIN(seq) FROM ` + t + ` WHERE key = ? AND state = 2) AND key = ? AND state = 2 RETURNING id`)
	q.hasDead = r(`SELECT 1 FROM ` + t + ` WHERE key = ? AND state = 2 LIMIT 1`)
	// SkipEvent: the key's oldest dead row, only if it has the ID given.
	q.skipEvent = r(`UPDATE ` + t + ` SET state = ? WHERE seq = (SELECT MIN(seq) FROM ` + t + ` WHERE key = ? AND state = 2) AND key = ? AND state = 2 AND id = ? RETURNING id`)
	q.deadHead = r(`SELECT id FROM ` + t + ` WHERE key = ? AND state = 2 ORDER BY seq LIMIT 1`)
	q.countStates = `SELECT state, COUNT(*) FROM ` + t + ` GROUP BY state`
	q.lookup = r(lookupQuery(t))

	// A lease is this relay's when both its owner name and its token are
	// (the token alone is unique per relay; the name guards against a relay
	// of an older version, which rewrites owner but not token). A lease of
	// another token is free only once expired.
	notLeased := `NOT EXISTS (SELECT 1 FROM ` + l + ` l WHERE l.key = o.key AND l.expires_at > ` + sqliteNow + ` AND (l.owner <> ? OR l.token IS NOT ?))`
	notDead := ` AND NOT EXISTS (SELECT 1 FROM ` + t + ` x WHERE x.key = o.key AND x.state = 2)`
	// Under Park, a key with a dead row gives nothing to fetch, whoever
	// holds its lease: a relay may claim the key between another relay's
	// claim walk and that relay's marking of the row dead (the walk checks
	// dead rows, the claim cannot), and must not publish past the row.
	notDeadFetch := ` AND NOT EXISTS (SELECT 1 FROM ` + t + ` x WHERE x.key = o.key AND x.state = 2)`
	// Marks of this relay's rows, only under the claim they belong to (key,
	// epoch, owner, token), still the key's lease row.
	if d == Postgres {
		notLeased = `NOT EXISTS (SELECT 1 FROM ` + l + ` l WHERE l.key = o.key AND l.expires_at > now() AND (l.owner <> ? OR l.token IS DISTINCT FROM ?))`
		// The lease rows are locked in key order (byte order, as the
		// relay sorts them), the order marks lock them in too: a renewal
		// and a mark of one relay never deadlock.
		q.renew = `UPDATE ` + l + ` AS l SET expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond'
	FROM (SELECT x.key FROM ` + l + ` AS x JOIN unnest($4::text[], $5::bigint[]) AS h(key, epoch) ON x.key = h.key AND x.epoch = h.epoch
		WHERE x.owner = $1 AND x.token = $2 ORDER BY x.key COLLATE "C" FOR UPDATE OF x) AS c
	WHERE l.key = c.key RETURNING l.key, l.epoch`
		q.release = `DELETE FROM ` + l + ` AS l USING unnest($3::text[], $4::bigint[]) AS h(key, epoch)
	WHERE l.owner = $1 AND l.token = $2 AND l.key = h.key AND l.epoch = h.epoch`
		// Every claim takes a new epoch from the outbox's sequence.
		q.acquireInsert = `INSERT INTO ` + l + ` (key, owner, expires_at, token, epoch)
	SELECT k, $2, clock_timestamp() + $3::bigint * interval '1 microsecond', $4, nextval('` + l + `_epoch') FROM unnest($1::text[]) AS k ORDER BY k
	ON CONFLICT (key) DO NOTHING RETURNING key, epoch`
		q.acquireTakeover = `UPDATE ` + l + ` AS l SET owner = $2, token = $4, expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond', epoch = nextval('` + l + `_epoch')
	FROM (SELECT key FROM ` + l + ` WHERE key = ANY($1) AND (expires_at <= clock_timestamp() OR (owner = $2 AND token = $4)) ORDER BY key FOR UPDATE SKIP LOCKED) AS c
	WHERE l.key = c.key RETURNING l.key, l.epoch`
		// Only the keys still under the claims given: h reads the
		// relay's lease rows in one index range (owner = $6, token = $7),
		// not one probe per key, and k keeps the claims ($1 keys, $2
		// cursors, $5 epochs) that are such a row under their epoch; each
		// such key's pending rows beyond its cursor are read (LATERAL,
		// at most $3, in seq order), at most $4 in all. Every step is
		// planned the same whatever the estimates (materialised CTEs;
		// the per-key read by the pending rows' index). Before, each
		// claim looked up its lease row by key (an index probe per held
		// key, at every poll: a quarter to a half of the fetch's reads with
		// 100 keys held); joined the other way round, with the lease
		// table's estimate off (a young table), PostgreSQL read the lease
		// rows and evaluated unnest() again for each: 86 ms for 100
		// claims.
		q.fetch = `WITH c AS MATERIALIZED (SELECT * FROM unnest($1::text[], $2::bigint[], $5::bigint[]) AS c(key, after, epoch)),
h AS MATERIALIZED (SELECT l.key, l.epoch FROM ` + l + ` AS l WHERE l.owner = $6 AND l.token = $7),
k AS MATERIALIZED (SELECT c.key, c.after FROM c JOIN h ON h.key = c.key AND h.epoch = c.epoch)
SELECT o.seq, o.id, o.key, o.type, o.payload, o.headers, o.created_at, o.attempts
	FROM k CROSS JOIN LATERAL (SELECT * FROM ` + t + ` o WHERE o.key = k.key AND o.state = 0 AND o.seq > k.after%s ORDER BY o.seq LIMIT $3) AS o
	ORDER BY o.seq LIMIT $4`
		q.fetchPark = fmt.Sprintf(q.fetch, notDeadFetch)
		q.fetch = fmt.Sprintf(q.fetch, "")
		// A mark locks its claims' lease rows (FOR SHARE, in key order)
		// before it touches a row: a takeover committed after the mark's
		// snapshot was taken makes the lock re-check the lease row (its
		// epoch has changed: the mark touches nothing), and a takeover
		// trying while the mark runs skips the row (it is locked) until
		// the mark has committed. Without the lock, a mark whose snapshot
		// predates a takeover could land after it, after the new holder
		// had read the row as pending.
		//
		// Every step is planned the same whatever the estimates (a young
		// table has none): the lock takes this relay's lease rows of the
		// marked rows' keys (key = ANY), whatever their epoch; x keeps
		// the marked rows whose claim (key, epoch) is such a row, joining
		// two materialised CTEs (a nested loop rescans a stored list);
		// the rows are then reached by their seq alone (seq = ANY, the
		// primary key: a seq is never reused and a row's key never
		// changes, so x's key matched the row's when the relay fetched
		// it; given the key too, the planner read every pending row of
		// the keys), through the primary key: state::integer keeps the
		// pending rows' partial index out (o.state = 0 let the planner
		// scan all of it, comparing each entry's seq). Before, with the
		// claims' (key, epoch) matched by joining unnest(...) to the lease
		// table, PostgreSQL evaluated unnest() again for each lease row
		// (55 ms per mark of 100 rows with 100 keys held), or read every
		// pending row of each key (1 s), so that a relay falling behind
		// marked ever more rows ever more slowly (outboxbench, 1 relay:
		// 370 delivered ev/s while 4,000 were written).
		held := `WITH m AS MATERIALIZED (SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS m(seq, key, epoch)),
h AS MATERIALIZED (SELECT l.key, l.epoch FROM ` + l + ` AS l
	WHERE l.owner = $4 AND l.token = $5 AND l.key = ANY($2::text[])
	ORDER BY l.key COLLATE "C" FOR SHARE OF l),
x AS MATERIALIZED (SELECT m.seq FROM m JOIN h ON h.key = m.key AND h.epoch = m.epoch)
`
		mine := `WHERE o.seq = ANY(ARRAY(SELECT seq FROM x)) AND o.state::integer = 0 RETURNING o.seq`
		q.markSentDelete = held + `DELETE FROM ` + t + ` AS o ` + mine
		q.markSentUpdate = held + `UPDATE ` + t + ` AS o SET state = 1, done_at = now() ` + mine
		q.markDead = `WITH h AS MATERIALIZED (SELECT l.key FROM ` + l + ` AS l WHERE l.key = $6 AND l.epoch = $7 AND l.owner = $2 AND l.token = $3 FOR SHARE)
UPDATE ` + t + ` AS o SET state = 2, attempts = o.attempts + $4, last_error = $5, done_at = now() FROM h WHERE o.seq = $1 AND o.key = h.key AND o.state = 0`
		q.cleanup = `DELETE FROM ` + t + ` WHERE seq IN (SELECT seq FROM ` + t + ` WHERE state = 1 AND done_at < now() - $1::bigint * interval '1 microsecond' ORDER BY seq LIMIT $2)`
		q.listenChannel = t
		q.idle = `INSERT INTO ` + t + `_idle (token, until) VALUES ($1, now() + $2::bigint * interval '1 microsecond')
	ON CONFLICT (token) DO UPDATE SET until = excluded.until`
		q.busy = `DELETE FROM ` + t + `_idle WHERE token = $1`
	} else {
		// SQLite has one writer: every write statement reads the latest
		// lease rows under the write lock, so the claim checks need no row
		// lock.
		q.renew = `UPDATE ` + l + ` SET expires_at = ` + sqliteExpiry + ` WHERE owner = ? AND token = ? AND (key, epoch) IN ` // the (key, epoch) list and RETURNING are appended
		q.release = `DELETE FROM ` + l + ` WHERE owner = ? AND token = ? AND (key, epoch) IN `
		// The first ? is the lease in microseconds; %s: rows (key, owner,
		// token, i), i = 1, 2, ...: the claims' epochs are the counter plus
		// i (the triggers move it on). The expiry written and the one
		// taken over are by SQLite's clock at this statement (sqliteNow).
		q.acquireUpsert = `INSERT INTO ` + l + ` (key, owner, expires_at, token, epoch)
	SELECT column1, column2, ` + sqliteExpiry + `, column3, (SELECT n FROM ` + l + `_epoch WHERE id = 1) + column4 FROM (VALUES %s) WHERE true
	ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at, token = excluded.token, epoch = excluded.epoch
	WHERE ` + l + `.expires_at <= ` + sqliteNow + ` OR (` + l + `.owner = excluded.owner AND ` + l + `.token = excluded.token) RETURNING key, epoch`
		fetch := `SELECT ` + rowCols + ` FROM ` + t + ` AS o WHERE o.key = ? AND o.state = 0 AND o.seq > ?
	AND EXISTS (SELECT 1 FROM ` + l + ` l WHERE l.key = o.key AND l.owner = ? AND l.token = ? AND l.epoch = ?)%s ORDER BY o.seq LIMIT ?`
		q.fetch = fmt.Sprintf(fetch, "")
		q.fetchPark = fmt.Sprintf(fetch, notDeadFetch)
		// The (seq, epoch) VALUES list and markSentSuffix are appended.
		mine := ` WHERE seq IN (SELECT o.seq FROM (VALUES `
		q.markSentDelete = `DELETE FROM ` + t + mine
		q.markSentUpdate = `UPDATE ` + t + ` SET state = 1, done_at = ?` + mine
		q.markSentSuffix = `) AS m JOIN ` + t + ` AS o ON o.seq = m.column1 JOIN ` + l + ` AS l ON l.key = o.key AND l.epoch = m.column2
	WHERE o.state = 0 AND l.owner = ? AND l.token = ?) RETURNING seq`
		q.markDead = `UPDATE ` + t + ` AS o SET state = 2, attempts = o.attempts + ?, last_error = ?, done_at = ? WHERE o.seq = ? AND o.state = 0
	AND EXISTS (SELECT 1 FROM ` + l + ` l WHERE l.key = o.key AND l.owner = ? AND l.token = ? AND l.epoch = ?)`
		q.cleanup = `DELETE FROM ` + t + ` WHERE seq IN (SELECT seq FROM ` + t + ` WHERE state = 1 AND done_at < ? ORDER BY seq LIMIT ?)`
	}
	q.releaseAll = r(`DELETE FROM ` + l + ` WHERE owner = ? AND token = ?`)
	q.releaseOthers = r(`DELETE FROM ` + l + ` WHERE owner = ? AND (token IS NULL OR token <> ?)`)
	q.probeColumns = `SELECT token, epoch FROM ` + l + ` LIMIT 0`
	q.probeEpoch = `SELECT * FROM ` + l + `_epoch LIMIT 0`
	q.probeTable = `SELECT seq, id, key, type, payload, headers, created_at, state, attempts, last_error, done_at FROM ` + t + ` LIMIT 0`
	// The keys with pending rows, walked in key order from a cursor one
	// index probe per key (a loose index scan on the pending rows' (key,
	// seq) index), at most a given number of keys per call, each with
	// whether it is free to claim: no live lease (and, for Park, no dead
	// row). The cost is per key visited, not per pending row.
	walk := `WITH RECURSIVE k(key, n) AS (
	SELECT (SELECT MIN(key) FROM ` + t + ` WHERE state = 0 AND key > ?), 1
	UNION ALL
	SELECT (SELECT MIN(key) FROM ` + t + ` WHERE state = 0 AND key > k.key), k.n + 1 FROM k WHERE k.key IS NOT NULL AND k.n < ?
)
SELECT o.key, ` + notLeased
	q.candidates = r(walk + ` FROM k AS o WHERE o.key IS NOT NULL`)
	q.candidatesPark = r(walk + notDead + ` FROM k AS o WHERE o.key IS NOT NULL`)
	return q
}

// pairList returns "(VALUES (?, ?), ...)" with n pairs of placeholders
// (SQLite only).
func pairList(n int) string {
	var b strings.Builder
	b.Grow(9 + 8*n)
	b.WriteString("(VALUES ")
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?)")
	}
	b.WriteByte(')')
	return b.String()
}

// timeArg converts t to the dialect's stored form.
func (q *queries) timeArg(t time.Time) any {
	if q.d == Postgres {
		return t.UTC()
	}
	return t.UnixMicro()
}

// timeDest returns a Scan destination for a stored time; timeOf reads it.
func (q *queries) timeDest() any {
	if q.d == Postgres {
		return new(sql.NullTime)
	}
	return new(sql.NullInt64)
}

func (q *queries) timeOf(dest any) time.Time {
	switch v := dest.(type) {
	case *sql.NullTime:
		if v.Valid {
			return v.Time.UTC()
		}
	case *sql.NullInt64:
		if v.Valid {
			return time.UnixMicro(v.Int64).UTC()
		}
	}
	return time.Time{}
}
