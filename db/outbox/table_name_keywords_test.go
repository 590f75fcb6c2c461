package outbox_test

import (
	"context"
	"database/sql"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/inbox"
	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// The ways the outbox's and the inbox's statements use their table's name
// unquoted ({t}): as a table to create, index, trigger on, insert into,
// select from (aliased, joined), update and delete from, and as a column
// qualifier (the inbox's Versions: WHERE t.version < excluded.version). On
// PostgreSQL the name is also the LISTEN channel (quoted, as listen.go
// sends it), the pg_notify channel (a string) and part of a custom
// setting's name (keysched_notify.<t>). The other objects' names are {t}
// with a suffix (_lease, _idle, _notify, ...).
var (
	keywordProbePostgres = []string{
		`ALTER TABLE keysched_probe RENAME TO {t}`,
		// Both exist: parsed and the table resolved, no catalog change
		// (an index built per word made the probe ten times slower).
		`CREATE TABLE IF NOT EXISTS {t} (key TEXT)`,
		`CREATE INDEX IF NOT EXISTS keysched_probe_pending_key ON {t} (key, seq) WHERE state = 0`,
		`CREATE OR REPLACE TRIGGER keysched_probe_notify AFTER INSERT ON {t} FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.keyword_probe()`,
		`INSERT INTO {t} (key, seq, state) VALUES ('k', 1, 0)`,
		`INSERT INTO {t} (key, seq, state) VALUES ('k', 1, 1) ON CONFLICT (seq) DO UPDATE SET state = excluded.state WHERE {t}.state < excluded.state`,
		`WITH ins AS (INSERT INTO {t} (key, seq, state) VALUES ('k', 2, 0)) SELECT pg_notify('{t}', '') FROM {t} WHERE false`,
		`SELECT o.seq FROM {t} AS o JOIN {t} x ON x.seq = o.seq WHERE o.key = 'k' AND NOT EXISTS (SELECT 1 FROM {t} l WHERE l.seq < 0)`,
		`UPDATE {t} SET state = 1 WHERE seq = 1`,
		`UPDATE {t} AS o SET state = 2 FROM {t} AS h WHERE o.seq = h.seq`,
		`DELETE FROM {t} AS o WHERE o.seq = 2`,
		`DELETE FROM {t} WHERE seq IN (SELECT seq FROM {t} WHERE state = 1)`,
		`SELECT set_config('keysched_notify.{t}', 'y', true)`,
		`LISTEN "{t}"`,
		`UNLISTEN "{t}"`,
		`DROP TRIGGER IF EXISTS {t}_notify ON {t}`,
	}
	keywordProbeSQLite = []string{
		`CREATE TABLE {t} (key TEXT, seq INTEGER PRIMARY KEY AUTOINCREMENT, state INTEGER)`,
		`CREATE INDEX IF NOT EXISTS {t}_pending_key ON {t} (key, seq) WHERE state = 0`,
		`INSERT INTO {t} (key, seq, state) VALUES ('k', 1, 0)`,
		`INSERT INTO {t} (key, seq, state) VALUES ('k', 1, 1) ON CONFLICT (seq) DO UPDATE SET state = excluded.state WHERE {t}.state < excluded.state`,
		`SELECT o.seq FROM {t} AS o JOIN {t} AS x ON x.seq = o.seq WHERE o.key = 'k' AND NOT EXISTS (SELECT 1 FROM {t} l WHERE l.seq < 0)`,
		`UPDATE {t} SET state = 1 WHERE seq = 1`,
		`UPDATE {t} AS o SET state = 2 WHERE o.seq = 1 AND EXISTS (SELECT 1 FROM {t} l WHERE l.seq = o.seq)`,
		`DELETE FROM {t} WHERE seq IN (SELECT seq FROM {t} WHERE state = 1)`,
		`SELECT COUNT(*) FROM pragma_table_info('{t}')`,
	}
)

// sqliteKeywordList is SQLite's keywords, lower-cased, as
// sqlite3_keyword_name lists them in the SQLite that modernc.org/sqlite
// v1.62.0 bundles (3.54.1; https://sqlite.org/lang_keywords.html). Written
// out rather than read from the library, whose C API the Go driver does
// not export.
const sqliteKeywordList = "reindex indexed index desc escape each check key before foreign for ignore regexp explain " +
	"instead add database as select table left then end deferrable else exclude delete " +
	"temporary temp or isnull nulls savepoint intersect ties notnull not no null like except " +
	"transaction action on natural alter raise exclusive exists constraint into offset of set " +
	"trigger range generated detach having glob begin inner references unique query without " +
	"with outer release attach between nothing groups group cascade asc default case collate " +
	"create current_date immediate join insert match plan analyze pragma materialized deferred " +
	"distinct is update values virtual always when where recursive abort after rename and drop " +
	"partition autoincrement to in cast column commit conflict cross current_timestamp " +
	"current_time current preceding fail last filter replace first following from full limit if " +
	"order restrict others over returning right rollback rows row unbounded union using vacuum " +
	"view window do by initially all primary"

// sqliteKeywords returns SQLite's keywords (sqliteKeywordList).
func sqliteKeywords(t *testing.T) []string {
	words := strings.Fields(sqliteKeywordList)
	require.Len(t, words, 147)
	return words
}

// postgresKeywords returns PostgreSQL's keywords (pg_get_keywords()).
func postgresKeywords(t *testing.T, db *sql.DB) []string {
	rows, err := db.Query(`SELECT word FROM pg_get_keywords()`)
	require.NoError(t, err)
	defer rows.Close()
	var words []string
	for rows.Next() {
		var w string
		require.NoError(t, rows.Scan(&w))
		words = append(words, w)
	}
	require.NoError(t, rows.Err())
	require.Greater(t, len(words), 400)
	return words
}

// WithTable (the outbox's and the inbox's) refuses every keyword of
// PostgreSQL and SQLite that the statements cannot use unquoted as the
// table's name, and only those: each keyword is either refused, or every use
// of the name (keywordProbe*) works on the database that has the keyword (a
// word that is not one of a database's keywords is a plain identifier
// there). Before, "select", "order", "user" and "table" were accepted and
// CreateSchema failed with a syntax error. One connection per database, no
// CreateSchema: on PostgreSQL a function runs the probe for every word (one
// round trip; a round trip per word took 1 to 4 s on a loaded machine), a
// table made once renamed to the word in a subtransaction rolled back;
// SQLite's DDL is what costs under -race (about 5 ms a statement), so it is
// probed for SQLite's keywords only, one round trip each.
func TestWithTableRefusesTheKeywordsTheSchemaCannotUse(t *testing.T) {
	ctx := context.Background()
	pg, err := dbtest.Postgres(t).Conn(ctx)
	require.NoError(t, err)
	defer pg.Close()
	for _, q := range []string{
		`CREATE FUNCTION pg_temp.keyword_probe() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$`,
		`CREATE TEMP TABLE keysched_probe (key TEXT, seq INTEGER PRIMARY KEY, state INTEGER)`,
		`CREATE INDEX keysched_probe_pending_key ON keysched_probe (key, seq) WHERE state = 0`,
		// For each word, the probe's statements with the word for {t},
		// in a subtransaction always rolled back; the words that fail,
		// with the error. One round trip for all the words.
		`CREATE FUNCTION pg_temp.keyword_failures(words text[], stmts text[]) RETURNS TABLE (word text, err text)
LANGUAGE plpgsql AS $$
DECLARE
	s text;
BEGIN
	FOREACH word IN ARRAY words LOOP
		BEGIN
			FOREACH s IN ARRAY stmts LOOP
				EXECUTE replace(s, '{t}', word);
			END LOOP;
			RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = 'keysched_probe_ok';
		EXCEPTION WHEN OTHERS THEN
			IF SQLERRM <> 'keysched_probe_ok' THEN
				err := SQLERRM;
				RETURN NEXT;
			END IF;
		END;
	END LOOP;
END
$$`,
	} {
		_, err = pg.ExecContext(ctx, q)
		require.NoError(t, err)
	}
	lite, err := sql.Open("sqlite", ":memory:") // one connection: one database
	require.NoError(t, err)
	defer lite.Close()
	lite.SetMaxOpenConns(1)

	pgProbe := func(words []string) map[string]string {
		rows, err := pg.QueryContext(ctx, `SELECT word, err FROM pg_temp.keyword_failures($1, $2)`, words, keywordProbePostgres)
		require.NoError(t, err)
		defer rows.Close()
		failed := map[string]string{}
		for rows.Next() {
			var w, e string
			require.NoError(t, rows.Scan(&w, &e))
			failed[w] = e
		}
		require.NoError(t, rows.Err())
		return failed
	}
	liteProbe := func(w string) error {
		q := "BEGIN;\n" + strings.ReplaceAll(strings.Join(keywordProbeSQLite, ";\n"), "{t}", w)
		_, err := lite.ExecContext(ctx, q)
		if _, rerr := lite.ExecContext(ctx, "ROLLBACK"); rerr != nil {
			return rerr
		}
		return err
	}
	// The probes work on a plain name (else they prove nothing).
	require.Empty(t, pgProbe([]string{"keysched_plain"}))
	require.NoError(t, liteProbe("keysched_plain"))

	fails := map[string][]string{} // word -> what failed
	words := map[string]bool{}
	pgWords := postgresKeywords(t, dbtest.Postgres(t))
	pgFailed := pgProbe(pgWords)
	for _, w := range pgWords {
		words[w] = true
		if e, ok := pgFailed[w]; ok {
			fails[w] = append(fails[w], "postgres: "+e)
		}
	}
	for _, w := range sqliteKeywords(t) {
		words[w] = true
		if err := liteProbe(w); err != nil {
			fails[w] = append(fails[w], "sqlite: "+err.Error())
		}
	}
	var needless []string
	for w := range words {
		_, obErr := outbox.New(lite, outbox.WithTable(w))
		_, ibErr := inbox.New(lite, inbox.WithTable(w))
		require.Equal(t, obErr == nil, ibErr == nil, "%q: the outbox's and the inbox's WithTable disagree", w)
		switch {
		case fails[w] != nil && obErr == nil:
			t.Errorf("%q is accepted by WithTable but fails: %q", w, fails[w])
		case fails[w] != nil:
			require.ErrorIs(t, obErr, outbox.ErrInvalidOption, w)
			require.ErrorContains(t, obErr, "reserved", w)
			require.ErrorIs(t, ibErr, inbox.ErrInvalidOption, w)
			require.ErrorContains(t, ibErr, "reserved", w)
		case obErr != nil:
			needless = append(needless, w)
		}
	}
	sort.Strings(needless)
	require.Empty(t, needless, "refused by WithTable, but every use works on both databases")
	if t.Failed() {
		var all []string
		for w := range fails {
			all = append(all, w)
		}
		sort.Strings(all)
		t.Logf("the words that fail: %q", all)
	}
}

// system_user is a reserved keyword since PostgreSQL 16 (SELECT system_user
// is the authenticated identity): CREATE TABLE system_user fails there with
// a syntax error. The server these tests run on (15) does not have it, so
// the probe above cannot find it; WithTable refuses it all the same.
func TestWithTableRefusesSystemUserReservedSincePostgreSQL16(t *testing.T) {
	db, err := sql.Open("sqlite", ":memory:") // not connected
	require.NoError(t, err)
	defer db.Close()
	_, err = outbox.New(db, outbox.WithTable("system_user"))
	require.ErrorIs(t, err, outbox.ErrInvalidOption)
	require.ErrorContains(t, err, "reserved")
	_, err = inbox.New(db, inbox.WithTable("system_user"))
	require.ErrorIs(t, err, inbox.ErrInvalidOption)
	require.ErrorContains(t, err, "reserved")
}
