// Package outbox is a transactional outbox with a per-key ordered relay on
// keysched, for SQLite (modernc.org/sqlite, pure Go) and PostgreSQL (pgx).
//
// At a glance, use it if you want:
//
//   - an event published if and only if the transaction that caused it
//     commits: Write inserts the event as a row in the caller's *sql.Tx, so a
//     rolled-back transaction publishes nothing and a committed one is
//     published at least once, whatever crashes in between;
//   - a relay that publishes pending rows in write order per key (the row's
//     key is its keysched key), keys in parallel on a bounded pool, with
//     retries, dead rows, and per-key isolation: a key whose sink fails or is
//     slow delays only its own later rows;
//   - several relays at once (two instances of a service) without a key's
//     rows ever going out of order: each key is claimed by one relay at a
//     time, with a lease;
//   - sinks for the in-process bus (BusSink), Kafka (package kafkasink,
//     franz-go) or any func(ctx, Event) error.
//
// Delivery is at-least-once: a relay that dies between publishing a row and
// marking it sent publishes it again (another relay does, after the lease
// expires). Consumers deduplicate on Event.ID, or gate on a version: see
// package inbox.
//
// # Schema
//
// Creation is explicit: CreateSchema, or the statements Schema returns put in
// your migrations. New never touches the database. The outbox table (default
// keysched_outbox) holds one row per event:
//
//	seq         identity (PostgreSQL) / INTEGER PRIMARY KEY AUTOINCREMENT (SQLite): write order, never reused
//	id          TEXT UNIQUE: the event ID
//	key, type   TEXT
//	payload     BYTEA / BLOB
//	headers     TEXT, a JSON object
//	created_at  TIMESTAMPTZ / INTEGER (Unix microseconds, UTC)
//	state       0 pending, 1 sent, 2 dead, 3 skipped
//	attempts    sink calls made for a dead row
//	last_error  the last attempt's error, for a dead row (at most 4096 bytes of UTF-8 text)
//	done_at     when the row was marked sent or dead
//
// with partial indexes on the pending rows (key, seq), the dead rows and the
// sent rows, and a lease table (keysched_outbox_lease: key, owner,
// expires_at, token, epoch: the holding relay's name and fencing token, see
// WithOwner, and the claim's epoch, see ClaimFrom) with the epochs' source
// (keysched_outbox_lease_epoch: a sequence on PostgreSQL, a one-row table
// and two triggers on SQLite). CreateSchema adds the token and epoch
// columns to a lease table created by an older version; a relay refuses to
// run without them (ErrSchemaOutdated). On PostgreSQL a statement-level AFTER INSERT trigger
// calls pg_notify with the table's name as the channel while a relay is idle
// (it has a live row in the unlogged table keysched_outbox_idle, written when
// a poll finds nothing, deleted when a fetch finds rows): an idle relay that
// LISTENs is woken when a transaction that wrote events commits; a busy one
// polls, and writes while no relay is idle notify nobody (see WithNotify).
// Under WithNotifyFromWrite there is no trigger: Write's INSERT statement
// sends the same notification itself, so only Write's rows wake a relay.
//
// # How a relay claims a key, and why rows are not claimed one by one
//
// A relay claims keys, not rows. Claiming rows with SELECT ... FOR UPDATE
// SKIP LOCKED alone cannot keep a key's order across relays: relay A locks
// row 10 of key k, relay B skips it and takes row 11 of k, and B may publish
// 11 before A publishes 10. So the unit of ownership is the key, and the
// claim is a row in the lease table:
//
//   - A relay looks for keys that have pending rows and no live lease
//     (walking the pending rows' keys in key order, one index probe per
//     key, a bounded number per poll from a rotating cursor), and claims
//     them: on PostgreSQL with
//     INSERT ... ON CONFLICT DO NOTHING for keys nobody holds and, for
//     expired leases, UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED),
//     so two relays racing for one expired lease never wait for each other
//     and only one gets it; on SQLite, which has one writer, with an upsert
//     whose WHERE accepts only an expired lease. A lease lasts
//     WithLeaseDuration (default 30 s) from when the claim's statement ran,
//     by the database's clock, after any wait for a lock (below), and the
//     relay renews the leases of the keys it holds every third of that (a
//     lease row of its own that it does not know of, say after a failed
//     release, is left to expire).
//   - A lease row carries the relay's name, a fencing token unique to each
//     Relay value (see WithOwner), and the claim's epoch: every claim of a
//     key (and every takeover) takes a new one, greater than any earlier
//     claim's of the key (see ClaimFrom). Renewals, releases, the fetch of
//     a key's rows and the marks (sent, dead) name the claim they belong to
//     (key, epoch, name, token) and affect nothing under another, so a
//     relay whose lease was taken over, or that lost a key and claimed it
//     again, cannot renew the old claim, mark rows under it or delete the
//     new holder's lease: its renewal or mark affects no row, and it stops
//     publishing the key under that claim (the sink call in flight is
//     cancelled, its rows stay pending). On PostgreSQL a mark locks the
//     lease row (FOR SHARE) before it touches a row, so a mark cannot land
//     after a takeover that its snapshot did not see. Two live relays under
//     one name are two holders like any others.
//   - While it holds a key's lease, the relay reads that key's pending rows
//     in seq order, beyond the last one it took, and submits them to its
//     keysched scheduler under the key: one at a time per key, in order.
//     Published rows are marked sent (or deleted) in batches.
//   - A key with nothing left in flight and nothing pending lingers: the
//     relay keeps (and renews) its lease and looks for its rows at every
//     poll, for ten poll intervals (WithPollInterval; at most a third of
//     the lease), so that a key whose rows come in bursts is not released
//     and claimed again (a commit each) between them. Then it is released
//     (its lease row deleted), so another relay can take it when new rows
//     arrive; at once if the relay's batch is full or if it holds
//     WithMaxKeys keys and another key waits. A key fetched from for longer than a lease duration (counted
//     from its first fetched row, not from the claim) stops fetching,
//     and is released once its rows in flight are settled, then claimed
//     afresh (by any relay) from its oldest pending row: that spreads busy
//     keys over the relays and bounds how long a row committed out of seq
//     order (below) waits. Counting from the claim, a relay whose first
//     fetch comes more than a lease after its claim (a database or a
//     machine slower than the lease) would release each key before
//     publishing anything, for ever. Close releases all of the relay's keys.
//
// The database computes a lease's expiry when the claim or renewal that
// writes it runs, after the statement got its locks: on SQLite from
// julianday('now'), read once per statement after the write lock was taken
// (a claim may wait up to the busy timeout for an application's write
// transaction or another relay), rounded up to the millisecond; on
// PostgreSQL from clock_timestamp(), read when the expiry is computed (after
// a table lock, and for a renewal after its lease rows' locks), not now(),
// the transaction's start, which comes before any wait. So a claim or a
// renewal that waited writes a full lease from the end of its wait, not one
// shortened by the wait or already expired, and an expired lease is judged
// by the same clock. Each relay keeps, per key, the local time at which its
// lease ends, measured from before the claim or renewal was sent, so it is
// never later than the database's expiry; after a wait it is that much
// earlier (a wait of a lease or more leaves the relay nothing of the lease
// until its next renewal: RelayStats.LapsedBeforeSink). A row is published
// only before that deadline, and the sink's context ends at it. Once a lease
// is lost (not renewed in time, or found taken by another relay), the relay
// publishes nothing more of that key: the sink call in flight is cancelled
// when a renewal or a mark finds the lease taken, rows published but not yet
// marked are left unmarked, its rows in flight are given back unpublished
// (they stay pending) and the key is forgotten until claimed again, from its
// oldest pending row.
//
// What happens when a relay dies holding a lease: its keys stay claimed
// until their leases expire (at most the lease duration), so their rows wait
// that long (unless the restarted relay, under the same WithOwner name, uses
// WithTakeOverOnStart: see its window); then any relay claims them and publishes from each key's oldest
// pending row. Rows the dead relay had published but not yet marked sent are
// published again: duplicates, in order (the key's stream restarts from an
// earlier row and goes on in order; no row is skipped). No row is lost and no
// key is published by two relays at once, on one condition: a sink call
// started before the lease ended must not land after it. The sink's context
// ends with the lease; a sink that ignores it (or a broker that completes a
// produce after the client gave up on it) can deliver late, after another
// relay's newer rows. Keep the lease well above your sink's timeout (NewRelay
// refuses a WithSinkTimeout above half of WithLeaseDuration). A
// process paused longer than its lease (a GC pause, a VM migration,
// SIGSTOP) with a sink call in flight lands that call after the next
// holder's whatever the relay does: ClaimFrom gives the sink the claim's
// epoch, a fencing token a downstream can check to refuse it (db/README.md,
// "Fencing epoch").
//
// Order is seq order, which is insert order. On PostgreSQL two transactions
// writing events of one key at once insert in one order and may commit in
// the other; the relay could then see (and publish) the later seq first, and
// the earlier one when it next reads the key from its oldest pending row:
// at its first fetch of the key with nothing of it in flight (a key with
// nothing in flight, lingering or not, is read from its oldest pending row),
// within about a lease duration on a key that never drains. Make a key's transactions serialise on
// that key, as state changes usually do (update the entity's row, which locks
// it, before Write). On SQLite writers are serialised anyway.
//
// Leases are only as good as the clocks: expiry is decided by the database
// server's clock on PostgreSQL and on SQLite by the wall clock of the
// process running the statement (SQLite's julianday('now')), while a relay's
// own deadline runs on its monotonic clock. A clock stepped forward by more
// than the margin between the two can let a lease expire early, and two
// relays publish one key at once, briefly. All relays of one outbox must use
// the same failure policy: a Continue relay goes past dead rows that a Park
// relay stops at.
//
// # Failures
//
// A sink error is retried with the relay's retry policy (WithRetry; default
// DefaultRetry, 10 attempts with exponential backoff and full jitter) while
// the key's later rows wait: other keys go on. A sink may return
// keysched.Snooze(err, d) for a local refusal (a full bulkhead, an open
// breaker, a rate limit): the row runs again after d without spending an
// attempt (still counted in RelayStats.SinkErrors). A row that fails for good
// (attempts exhausted, an error wrapped with keysched.Permanent, or a
// panicking sink after its retries: a panic is a failed call, counted in
// RelayStats.SinkErrors) is marked dead in the database with its
// error and attempt count, and logged; it is never silently skipped. Then,
// per WithFailurePolicy:
//
//   - keysched.Continue (the default): the key goes on with its next row.
//   - keysched.Park: the key stops. Its dead row keeps every relay off the
//     key (the claim query skips keys with a dead row, and a relay that
//     claimed the key just as its row died fetches nothing of it), across
//     restarts,
//     until an operator calls Resume (publish the dead row again, then the
//     rest) or Skip (give it up and go on; SkipHead also returns the ID of
//     the row it gave up). Parked lists such keys, Dead the rows. An
//     operator who decided from a view of the head (a page, a Dead
//     listing) calls SkipEvent(ctx, key, id): it gives up the head only if
//     it is still the event id (one statement), else returns
//     ErrHeadChanged naming the current head; Skip gives up whatever the
//     head is when its statement runs, which may be an event the operator
//     never saw (the head seen resumed and published, the next one dead).
//
// Recover is the operator's bulk form: the dead (and, on request, skipped)
// rows matching a RecoverFilter (keys, IDs, type, time ranges, error text)
// made pending again in key order, one transaction per batch, returning
// what moved; Recoverable is its dry run.
//
// # Your writes with the marks: WithMarkHook
//
// WithMarkHook runs a function inside the transaction that marks published
// rows sent (and each one that marks a row dead), after the marking
// statement, with exactly the rows that statement marked under this relay's
// claims: a delivery record, an audit row or a counter written through its
// *sql.Tx commits if and only if the marks do. A sink passes a value to it
// with SetMarkNote (Marked.Note); work that must follow the commit goes to
// AfterMarkCommit. A hook error (or panic) rolls the marks back: the rows stay pending,
// held by the relay, which marks them again every poll interval (publishing
// nothing again) while it holds their keys; a relay that stops or loses a
// key first leaves them to be published again. See WithMarkHook.
//
// # Database faults
//
// The relay rides out a database that fails: a restart or failover, a
// terminated connection, a statement_timeout or lock_timeout, SQLite busy
// past its timeout, a read-only or failing disk. A failed call is retried at
// the next poll, renewal or flush, on a new connection when the old one
// broke; each call is bounded by a third of the lease (at least 5 s), so a
// server that stops answering holds nothing for ever. Meanwhile no key is
// published past its lease (the relay's local deadline stops it), and once
// the database is back the keys whose leases expired are claimed again, by
// this relay or another, from their oldest pending row. Published rows whose
// marks failed are marked once it is back, or published again by the key's
// next holder (duplicates, in order, never a loss).
//
// What the caller sees: RelayStats.DBErrors, DBErrorKinds (by
// sqldb.Classify) and DBFailingFor; one log line when the calls start
// failing, one when they have failed 10, 100, 1000... times in a row (with
// the last error), one when a poll succeeds again, never one per failed
// call. Run does not return because of the database unless WithMaxOutage is
// given (then, once every poll has failed that long, it returns an error
// wrapping ErrDatabaseUnavailable and the last error); on a database without
// the outbox's tables it returns ErrNoSchema at once, and on a *sql.DB the
// caller closed (no call on it can ever pass) an error wrapping ErrDBClosed
// at its next poll. Close stays bounded by
// its context (plus keysched.CloseGrace) while the database is away, and
// reports the published rows it could not mark and the leases it could not
// release.
//
// # Shutdown
//
// Close stops claiming, lets the sink calls in progress finish, and the dead
// marks of rows that failed for good (until its context ends), gives back
// the rows that had not started (queued, or waiting out a retry backoff or
// a Snooze), marks what was
// published and releases the leases; cancelling Run's context does the same
// at once. Rows given back stay pending and are published by the next relay
// to claim their key. Close returns within keysched.CloseGrace of its
// context's end even if a sink call ignores its cancelled context: it then
// reports the calls still running, which finish in the background (see
// Relay.Close).
package outbox
