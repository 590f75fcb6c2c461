package outbox

import (
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/keysched/keysched/db/sqldb"
)

// schema returns the DDL for the dialect. Times are TIMESTAMPTZ on
// PostgreSQL and INTEGER microseconds since the Unix epoch (UTC) on SQLite.
func schema(d Dialect, t string) []string {
	if d == Postgres {
		return []string{
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
	token      TEXT
)`,
			// A lease table created before the token column (idempotent).
			`ALTER TABLE ` + t + `_lease ADD COLUMN IF NOT EXISTS token TEXT`,
			`CREATE INDEX IF NOT EXISTS ` + t + `_lease_owner ON ` + t + `_lease (owner)`,
			`CREATE OR REPLACE FUNCTION ` + t + `_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_notify('` + t + `', '');
	RETURN NULL;
END
$$`,
			`CREATE OR REPLACE TRIGGER ` + t + `_notify AFTER INSERT ON ` + t + `
	FOR EACH STATEMENT EXECUTE FUNCTION ` + t + `_notify()`,
		}
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
	token      TEXT
)`,
		`CREATE INDEX IF NOT EXISTS ` + t + `_lease_owner ON ` + t + `_lease (owner)`,
	}
}

// sqliteAddToken adds the token column to a SQLite lease table created
// before it (CreateSchema checks that it is missing first).
func sqliteAddToken(t string) string {
	return `ALTER TABLE ` + t + `_lease ADD COLUMN token TEXT`
}

// queries holds the dialect's statements, with placeholders already in the
// dialect's form.
type queries struct {
	d     Dialect
	table string

	insert, listDead, parkedKeys, moveDead, hasDead, countStates string

	// relay
	renew, release, releaseAll         string // renew: only the keys given (SQLite: a prefix)
	releaseOthers                      string // WithTakeOverOnStart
	candidates, candidatesPark         string
	acquireInsert, acquireTakeover     string // Postgres
	acquireUpsert                      string // SQLite: %s is the VALUES list
	fetch                              string
	fetchPark                          string // fetch, nothing of a key with a dead row
	markSentDelete, markSentUpdate     string // SQLite: a prefix; the seq list and markSentSuffix are appended
	markSentSuffix                     string
	probeToken                         string // fails when the lease table lacks the token column
	probeTable                         string // fails when the outbox table is missing
	markDead, cleanup                  string
	listenChannel, notifyChannelQuoted string
}

const rowCols = `seq, id, key, type, payload, headers, created_at, attempts`

func newQueries(d Dialect, t string) queries {
	r := func(s string) string { return sqldb.Rebind(d, s) }
	l := t + "_lease"
	q := queries{d: d, table: t}
	q.insert = r(`INSERT INTO ` + t + ` (id, key, type, payload, headers, created_at) VALUES (?, ?, ?, ?, ?, ?)`)
	q.listDead = r(`SELECT seq, id, key, type, payload, headers, created_at, attempts, last_error, done_at FROM ` + t + ` WHERE state = 2 ORDER BY seq LIMIT ?`)
	q.parkedKeys = `SELECT DISTINCT key FROM ` + t + ` WHERE state = 2 ORDER BY key`
	q.moveDead = r(`UPDATE ` + t + ` SET state = ? WHERE seq = (SELECT MIN(seq) FROM ` + t + ` WHERE key = ? AND state = 2) AND key = ? AND state = 2 RETURNING id`)
	q.hasDead = r(`SELECT 1 FROM ` + t + ` WHERE key = ? AND state = 2 LIMIT 1`)
	q.countStates = `SELECT state, COUNT(*) FROM ` + t + ` GROUP BY state`

	// A lease is this relay's when both its owner name and its token are
	// (the token alone is unique per relay; the name guards against a relay
	// of an older version, which rewrites owner but not token). A lease of
	// another token is free only once expired.
	notLeased := `NOT EXISTS (SELECT 1 FROM ` + l + ` l WHERE l.key = o.key AND l.expires_at > ? AND (l.owner <> ? OR l.token IS NOT ?))`
	notDead := ` AND NOT EXISTS (SELECT 1 FROM ` + t + ` x WHERE x.key = o.key AND x.state = 2)`
	// Under Park, a key with a dead row gives nothing to fetch, whoever
	// holds its lease: a relay may claim the key between another relay's
	// claim walk and that relay's marking of the row dead (the walk checks
	// dead rows, the claim cannot), and must not publish past the row.
	notDeadFetch := ` AND NOT EXISTS (SELECT 1 FROM ` + t + ` x WHERE x.key = o.key AND x.state = 2)`
	// Marks of this relay's rows, only on keys whose lease it still holds.
	held := `EXISTS (SELECT 1 FROM ` + l + ` l WHERE l.key = o.key AND l.owner = ? AND l.token = ?)`
	if d == Postgres {
		notLeased = `NOT EXISTS (SELECT 1 FROM ` + l + ` l WHERE l.key = o.key AND l.expires_at > now() AND (l.owner <> ? OR l.token IS DISTINCT FROM ?))`
		q.renew = `UPDATE ` + l + ` SET expires_at = now() + $3::bigint * interval '1 microsecond' WHERE owner = $1 AND token = $2 AND key = ANY($4) RETURNING key`
		q.release = `DELETE FROM ` + l + ` WHERE owner = $1 AND token = $2 AND key = ANY($3)`
		q.acquireInsert = `INSERT INTO ` + l + ` (key, owner, expires_at, token)
	SELECT k, $2, now() + $3::bigint * interval '1 microsecond', $4 FROM unnest($1::text[]) AS k ORDER BY k
	ON CONFLICT (key) DO NOTHING RETURNING key`
		q.acquireTakeover = `UPDATE ` + l + ` AS l SET owner = $2, token = $4, expires_at = now() + $3::bigint * interval '1 microsecond'
	FROM (SELECT key FROM ` + l + ` WHERE key = ANY($1) AND (expires_at <= now() OR (owner = $2 AND token = $4)) ORDER BY key FOR UPDATE SKIP LOCKED) AS c
	WHERE l.key = c.key RETURNING l.key`
		q.fetch = `SELECT o.seq, o.id, o.key, o.type, o.payload, o.headers, o.created_at, o.attempts
	FROM unnest($1::text[], $2::bigint[]) AS c(key, after)
	CROSS JOIN LATERAL (SELECT * FROM ` + t + ` o WHERE o.key = c.key AND o.state = 0 AND o.seq > c.after%s ORDER BY o.seq LIMIT $3) AS o
	ORDER BY o.seq LIMIT $4`
		q.fetchPark = fmt.Sprintf(q.fetch, notDeadFetch)
		q.fetch = fmt.Sprintf(q.fetch, "")
		pgHeld := `EXISTS (SELECT 1 FROM ` + l + ` l WHERE l.key = o.key AND l.owner = $2 AND l.token = $3)`
		q.markSentDelete = `DELETE FROM ` + t + ` AS o WHERE o.state = 0 AND o.seq = ANY($1) AND ` + pgHeld + ` RETURNING o.seq`
		q.markSentUpdate = `UPDATE ` + t + ` AS o SET state = 1, done_at = now() WHERE o.state = 0 AND o.seq = ANY($1) AND ` + pgHeld + ` RETURNING o.seq`
		q.markDead = `UPDATE ` + t + ` AS o SET state = 2, attempts = o.attempts + $4, last_error = $5, done_at = now() WHERE o.seq = $1 AND o.state = 0 AND ` + pgHeld
		q.cleanup = `DELETE FROM ` + t + ` WHERE seq IN (SELECT seq FROM ` + t + ` WHERE state = 1 AND done_at < now() - $1::bigint * interval '1 microsecond' ORDER BY seq LIMIT $2)`
		q.listenChannel = t
	} else {
		q.renew = `UPDATE ` + l + ` SET expires_at = ? WHERE owner = ? AND token = ? AND key IN ` // the key list and RETURNING key are appended
		q.release = `DELETE FROM ` + l + ` WHERE owner = ? AND token = ? AND key IN `
		q.acquireUpsert = `INSERT INTO ` + l + ` (key, owner, expires_at, token) VALUES %s
	ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at, token = excluded.token
	WHERE ` + l + `.expires_at <= ? OR (` + l + `.owner = excluded.owner AND ` + l + `.token = excluded.token) RETURNING key`
		fetch := `SELECT ` + rowCols + ` FROM ` + t + ` AS o WHERE o.key = ? AND o.state = 0 AND o.seq > ?%s ORDER BY o.seq LIMIT ?`
		q.fetch = fmt.Sprintf(fetch, "")
		q.fetchPark = fmt.Sprintf(fetch, notDeadFetch)
		// The seq list and markSentSuffix are appended.
		q.markSentDelete = `DELETE FROM ` + t + ` AS o WHERE o.state = 0 AND ` + held + ` AND o.seq IN `
		q.markSentUpdate = `UPDATE ` + t + ` AS o SET state = 1, done_at = ? WHERE o.state = 0 AND ` + held + ` AND o.seq IN `
		q.markSentSuffix = ` RETURNING seq`
		q.markDead = `UPDATE ` + t + ` AS o SET state = 2, attempts = o.attempts + ?, last_error = ?, done_at = ? WHERE o.seq = ? AND o.state = 0 AND ` + held
		q.cleanup = `DELETE FROM ` + t + ` WHERE seq IN (SELECT seq FROM ` + t + ` WHERE state = 1 AND done_at < ? ORDER BY seq LIMIT ?)`
	}
	q.releaseAll = r(`DELETE FROM ` + l + ` WHERE owner = ? AND token = ?`)
	q.releaseOthers = r(`DELETE FROM ` + l + ` WHERE owner = ? AND (token IS NULL OR token <> ?)`)
	q.probeToken = `SELECT token FROM ` + l + ` LIMIT 0`
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

// inList returns "(?, ?, ...)" with n placeholders (SQLite only).
func inList(n int) string {
	var b strings.Builder
	b.Grow(2 + 3*n)
	b.WriteByte('(')
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('?')
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
