package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/db/sqldb"
)

// A Relay publishes an outbox's pending rows through a Sink: in order per
// key, keys in parallel, on a keysched.Scheduler[string] whose key is the
// row's key. Make one with Outbox.NewRelay, start it with Run, stop it with
// Close. Several relays (in one process or several) may run on one outbox:
// each key is published by one relay at a time (see the package doc).
//
// What a relay holds, and for how long: the lease of each key it claimed
// (at most WithMaxKeys), renewed every third of WithLeaseDuration while it
// holds the key. It lets a key go (deletes its lease row) when the key has
// had nothing pending and nothing in flight for ten poll intervals
// (WithPollInterval; at most a third of the lease): the key lingers
// meanwhile, and a row written to it then is published under the same
// claim, with no release and no new claim (each a commit). It lets a
// drained key go at once when its batch is full (WithBatchSize: it could
// not fetch the key's next rows) or when it holds WithMaxKeys keys and
// another key with pending rows waits for a slot; a key it has fetched
// from for a lease is let go once its rows in flight settle (see the
// package doc); a key whose lease was lost, or that it parked, is let go
// once its rows in flight are given back. Close, and the end of Run, let
// every key go.
//
// The zero Relay is not usable: use Outbox.NewRelay. The methods of a nil or
// zero Relay return ErrZeroRelay (those with an error result) or zero
// values, and do nothing else.
type Relay struct {
	o      *Outbox
	sink   Sink
	cfg    relayConfig
	sched  *keysched.Scheduler[string]
	log    *slog.Logger
	clock0 time.Time // the zero of mono()
	token  string    // fencing token: unique to this Relay, stored in its lease rows

	wake     chan struct{} // loop wake-up (cap 1)
	flushSig chan struct{} // flusher wake-up (cap 1)
	closing  chan struct{} // closed by Close
	done     chan struct{} // closed when Run returns
	// started: 0 until Run or Close; then runStarted (Run came first)
	// or closedUnrun (Close came first, Run never ran).
	started  atomic.Int32
	stopping atomic.Bool
	// dbClosed is the first failed call's error on a *sql.DB whose Close
	// was called (sqldb.IsDBClosed), with the call: Run returns it.
	dbClosed atomic.Pointer[error]

	// runCtx is Run's context, set once at its start, before any
	// database call: a call that fails because it ended is the relay
	// stopping, not the database failing (dbError).
	runCtx context.Context

	closeOnce sync.Once
	closeCtx  context.Context // set before closing is closed
	crash     bool            // tests: leave leases and marks as a crash would
	noMark    bool            // tests: never mark published rows (a crash right after publishing)
	// afterWalk, for tests, is called with the free keys a claim walk
	// found, before they are claimed (forces interleavings).
	afterWalk func(found []string)
	// beforeFetch, for tests, is called by each poll between claiming
	// and fetching (a slow database or a starved process).
	beforeFetch func()
	// afterPoll, for tests, is called by the loop after each poll with
	// when it began (r.mono()) and its result.
	afterPoll func(began int64, full, idle bool)

	// idle: the relay's row in <table>_idle is live (PostgreSQL, with the
	// NOTIFY trigger and LISTEN): writers notify it. Written by the loop
	// goroutine only (see idle.go); idleAt, noIdle likewise.
	idleRow  atomic.Bool
	idleAt   int64 // r.mono() when the row was last written
	noIdle   bool  // the table was missing at the last try (a schema of an older version)
	noIdleAt int64 // r.mono() at that try: the next is a third of a lease later

	okCalls   atomic.Uint64 // successful database calls (walks, fetches, renewals, marks)
	lastClean int64         // loop goroutine only
	lastRows  int64         // loop goroutine only: r.mono() at the end of the last poll that found rows (0: none yet)
	cursor    string        // loop goroutine only: where the next key walk starts
	fetchStmt *sql.Stmt

	// leaseMu makes claiming and renewing take turns, so that a renewal
	// sees every lease claimed before it (a key missing from its result is
	// really lost).
	leaseMu sync.Mutex

	mu       sync.Mutex // guards keys, inflight, settled, tenure.inflight, active, marking
	keys     map[string]*tenure
	inflight int
	settled  int // rows settled since the last poll
	active   int // task functions running now
	marking  int // dead marks in progress (onDeadLetter, begun before Run stopped)
	idle     *sync.Cond

	fmu    sync.Mutex
	toMark []*job

	health health
	// shutdownErr: what Run's last database calls (marking the published
	// rows, releasing the leases) failed with; set before done is closed.
	shutdownErr error

	leaseWarn, lapseWarn rateLimit // see checkClaimTime and runJob

	st struct {
		published, sinkErrors, marked, dead, abandoned, leasesLost atomic.Uint64
		slowClaims, lapsedBeforeSink                               atomic.Uint64
		polls, notifications, dbErrors                             atomic.Uint64
		keysHeld                                                   atomic.Int64
		listening                                                  atomic.Bool
	}
}

// NewRelay returns a relay that publishes this outbox's pending rows with
// sink. It starts the relay's scheduler (and its pool of workers) but reads
// nothing before Run. Call Close to release it. A nil sink gets ErrNilSink, a
// bad option an error wrapping ErrInvalidOption, a nil or zero Outbox
// ErrZeroOutbox.
func (o *Outbox) NewRelay(sink Sink, opts ...RelayOption) (*Relay, error) {
	if o.zero() {
		return nil, ErrZeroOutbox
	}
	if sink == nil {
		return nil, ErrNilSink
	}
	cfg, err := newRelayConfig(opts)
	if err != nil {
		return nil, err
	}
	if cfg.owner == "" {
		cfg.owner = uuid.NewString()
	}
	r := &Relay{
		o: o, sink: sink, cfg: cfg, log: cfg.logger, clock0: time.Now(), token: uuid.NewString(),
		wake: make(chan struct{}, 1), flushSig: make(chan struct{}, 1),
		closing: make(chan struct{}), done: make(chan struct{}),
		keys: map[string]*tenure{},
	}
	r.idle = sync.NewCond(&r.mu)
	sopts := []keysched.Option{
		keysched.WithRetry(cfg.retry),
		keysched.WithLogger(cfg.logger),
	}
	if cfg.workersSet {
		// Without WithWorkers the scheduler's default (DefaultWorkers, the
		// same 64) gives way, as keysched.Option says, to a
		// keysched.WithMaxConcurrency or keysched.WithPool given with
		// WithSchedulerOptions.
		sopts = append(sopts, keysched.WithWorkers(cfg.workers))
	}
	if cfg.taskTimeout > 0 {
		sopts = append(sopts, keysched.WithTaskTimeout(cfg.taskTimeout))
	}
	// The caller's scheduler options (WithSchedulerOptions refused those
	// that make the settings below), then the settings the relay's
	// correctness rests on.
	sopts = append(sopts, cfg.schedOpts...)
	sopts = append(sopts,
		keysched.WithMaxPending(cfg.batch),
		keysched.WithMaxKeyDepth(cfg.batch),
		keysched.WithRetryPanics(),
		keysched.WithFailurePolicy(keysched.Continue),
		keysched.WithDeadLetter(r.onDeadLetter),
	)
	s, err := keysched.New[string](sopts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	r.sched = s
	return r, nil
}

// Scheduler returns the relay's scheduler (keys are the rows' keys), for
// metrics and inspection (e.g. otelkeysched's Metrics.Register, with its
// Observer given through WithSchedulerOptions; OldestAge and Keys report
// ages only with keysched.WithTaskAges or an observer). Do not submit to it, Close it, or Resume/Skip its
// keys: the relay owns it (use Relay.Resume and Relay.Skip).
func (r *Relay) Scheduler() *keysched.Scheduler[string] {
	if r.zero() {
		return nil
	}
	return r.sched
}

// Owner returns the relay's name in the lease table.
func (r *Relay) Owner() string {
	if r.zero() {
		return ""
	}
	return r.cfg.owner
}

// zero reports a nil Relay or one not made by Outbox.NewRelay.
func (r *Relay) zero() bool { return r == nil || r.sched == nil }

// Token returns the relay's fencing token: a random UUID made by NewRelay,
// unique to this Relay value, stored with its name in each lease row it
// holds (column token). See WithOwner. "" for a nil or zero Relay.
func (r *Relay) Token() string {
	if r.zero() {
		return ""
	}
	return r.token
}

// closed reports whether Close was called.
func (r *Relay) closed() bool {
	select {
	case <-r.closing:
		return true
	default:
		return false
	}
}

func (r *Relay) mono() int64 { return int64(time.Since(r.clock0)) }

func (r *Relay) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run reads and publishes pending rows until ctx ends or Close is called. A
// relay runs once: Run after Close returns ErrClosed, and a second Run
// returns an error matching ErrClosed (errors.Is) whose text says that Run
// is already running, or has returned.
//
// When Close is called, Run stops claiming and fetching, lets the sink calls
// in progress finish, and the dead marks in progress of rows that failed for
// good (with the mark hook and WithOnDead), until Close's context ends (then
// the sink calls' contexts are cancelled), gives back the rows that had not
// started (queued behind them, or waiting out a retry backoff or a Snooze),
// marks what was published, releases its
// leases and returns nil. When ctx ends, Run does the same at once: sink
// calls in progress see their context cancelled, and Run returns ctx's error
// once they have returned. Rows given back stay pending: they are published
// by this outbox's next relay to claim their key.
//
// Run first checks that the outbox's tables exist with the columns it uses:
// it returns an error wrapping ErrNoSchema (a table missing) or
// ErrSchemaOutdated (the lease table without its token or epoch column, or
// no epoch counter) at once. On a SQLite database in a file whose
// connections have no busy timeout (a plain sql.Open("sqlite", path) rather
// than sqldb.OpenSQLite) it then logs a warning on the relay's logger
// (WithLogger) naming sqldb.OpenSQLite, and runs: its claims and marks, and
// the application's writes, will fail with SQLITE_BUSY whenever two meet. A
// database that does not answer is an outage, not an error: Run retries
// every poll interval, then and while it runs, and returns because of the
// database only with WithMaxOutage (an error wrapping
// ErrDatabaseUnavailable), or when the outbox's *sql.DB was closed (its
// Close called: no call on it can pass): Run then returns, after the first
// call that fails so (its next poll, WithPollInterval at most, or a renewal
// or mark), an error wrapping ErrDBClosed and database/sql's error, having
// shut down as on Close (its marks and release fail too: the rows published
// and not marked stay pending, the leases expire). See the package doc's
// "Database faults".
func (r *Relay) Run(ctx context.Context) error {
	if r.zero() {
		return ErrZeroRelay
	}
	if ctx == nil {
		return keysched.ErrNilContext
	}
	if !r.started.CompareAndSwap(0, runStarted) {
		if r.started.Load() == closedUnrun {
			return ErrClosed
		}
		select {
		case <-r.done:
			return runAgainError{running: false}
		default:
			return runAgainError{running: true}
		}
	}
	r.runCtx = ctx // before any call: see dbError
	defer close(r.done)
	doneCtx, cancelDone := context.WithCancel(context.Background())
	cancelDone()
	select {
	case <-r.closing:
		// Close came after Run started but before this: Close leaves the
		// scheduler to Run, which has submitted nothing yet.
		_ = r.sched.Close(r.closeCtx)
		return ErrClosed
	default:
	}
	if err := r.checkSchema(ctx); err != nil {
		_ = r.sched.Close(doneCtx)
		return err
	}
	if r.o.dialect == SQLite {
		cctx, cancel := r.callCtx(ctx)
		r.o.warnNoBusyTimeout(cctx, r.log, "Relay.Run")
		cancel()
	}
	if r.cfg.takeOver {
		// The predecessor's keys are free at once (see WithTakeOverOnStart).
		cctx, cancel := r.callCtx(ctx)
		res, err := r.o.db.ExecContext(cctx, r.o.q.releaseOthers, r.cfg.owner, r.token)
		cancel()
		if err != nil {
			r.dbError("take over the leases of the relay's name", err)
		} else if n, _ := res.RowsAffected(); n > 0 {
			r.log.Info("outbox relay: took over the leases of a previous relay of the same name", "table", r.o.table, "owner", r.cfg.owner, "keys", n)
		}
	}
	bg, cancelBG := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBG()
	// The loop's database calls end with ctx, and when Close's context
	// ends; the flusher's and renewer's too (Run's last marks and release
	// then run on a context of their own).
	loopCtx, cancelLoop := context.WithCancel(ctx)
	defer cancelLoop()
	go func() {
		select {
		case <-r.closing:
			select {
			case <-r.closeCtx.Done():
				cancelLoop()
				cancelBG()
			case <-loopCtx.Done():
			}
		case <-loopCtx.Done():
		}
	}()
	var wg sync.WaitGroup
	stopFlush := make(chan struct{})
	wg.Add(2)
	go func() { defer wg.Done(); r.flusher(bg, stopFlush) }()
	go func() { defer wg.Done(); r.renewer(bg, stopFlush) }()
	lctx, cancelListen := context.WithCancel(ctx)
	defer cancelListen()
	if r.o.dialect == Postgres && r.cfg.listen {
		wg.Add(1)
		go func() { defer wg.Done(); r.listen(lctx) }()
	}

	if r.o.dialect == SQLite {
		// One query per key and poll: parse it once (pgx caches its
		// statements by itself).
		q := r.o.q.fetch
		if r.cfg.policy == keysched.Park {
			q = r.o.q.fetchPark
		}
		if st, err := r.o.db.PrepareContext(ctx, q); err == nil {
			r.fetchStmt = st
			defer st.Close()
		}
	}
	err := r.loop(loopCtx, ctx)

	// Shut down: no claim after this; tasks that have not started give
	// their rows back.
	r.stopping.Store(true)
	closeCtx := context.Context(nil)
	if err == nil {
		closeCtx = r.closeCtx
	} else {
		c, cancel := context.WithCancel(context.Background())
		cancel()
		closeCtx = c
	}
	// The sink calls in progress finish, and the dead marks in progress
	// (until closeCtx ends); then the scheduler closes at once: the rows
	// queued, or waiting out a retry backoff or a Snooze, are given back
	// (aborted tasks come back through onDeadLetter), not waited for.
	r.waitTasksUntil(closeCtx)
	ended, end := context.WithCancel(context.Background())
	end()
	_ = r.sched.Close(ended)
	r.waitTasks() // a sink call Close gave up on must return before the key is let go
	close(stopFlush)
	cancelListen()
	wg.Wait()
	if !r.crash {
		// Each bounded as every call (callTimeout): a database that is
		// away does not hold Run (nor Close: see there) for ever.
		fctx, cancel := r.callCtx(context.WithoutCancel(ctx))
		if !r.flushAll(fctx) {
			r.fmu.Lock()
			n := len(r.toMark)
			r.fmu.Unlock()
			_, _, _, last := r.outage()
			if last == nil {
				last = errors.New("marking failed")
			}
			r.shutdownErr = fmt.Errorf("outbox: %d published rows not marked sent (they stay pending: published again once their leases expire): %w", n, last)
		}
		cancel()
		// No more notifications for this relay; bounded short, as the
		// row expires by itself (a lease after it was written).
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		r.goBusy(bctx)
		cancel()
		fctx, cancel = r.callCtx(context.WithoutCancel(ctx))
		if _, e := r.o.db.ExecContext(fctx, r.o.q.releaseAll, r.cfg.owner, r.token); e != nil {
			r.dbError("release leases", e)
			r.shutdownErr = errors.Join(r.shutdownErr, fmt.Errorf("outbox: leases not released (their keys wait until they expire): %w", e))
		}
		cancel()
	}
	r.st.keysHeld.Store(0)
	return err
}

// The values of Relay.started after 0.
const (
	runStarted  = 1
	closedUnrun = 2
)

// runAgainError is Run's error when Run was called before: it matches
// ErrClosed (errors.Is), as documented, and says what happened.
type runAgainError struct{ running bool }

func (e runAgainError) Error() string {
	if e.running {
		return "outbox: Run called while the relay's Run is running (a Relay runs once)"
	}
	return "outbox: Run called after the relay's Run returned (a Relay runs once: make another with Outbox.NewRelay)"
}

func (runAgainError) Is(target error) bool { return target == ErrClosed }

// Close stops the relay: see Run. It waits for Run to return, or for ctx to
// end: then the sink calls in progress see their context cancelled, the rows
// not started are given back, the poll's database calls are cancelled, and
// Close returns within keysched.CloseGrace (100 ms) of ctx's end, whatever
// the sink and the database do. If Run is then still marking the published
// rows and releasing its leases (the database is slow or away), Close
// returns an error wrapping ctx's error that says so; those calls go on in
// the background, each bounded by a third of the lease, at least 5 s. If a sink call still
// runs after the grace (it ignores its cancelled context), Close returns an error
// wrapping ctx's error that counts the sink calls still running; they finish
// in the background and Run returns once they have: a call that then
// succeeds is marked sent (the relay keeps the key's lease until then, so no
// other relay publishes the key meanwhile), one that fails leaves its row
// pending, and the relay then releases its leases. If the process exits
// first, those rows stay pending and are published again (duplicates) once
// the leases expire. Close returns nil when Run finished in time (also when
// Run had returned before Close was called, whatever ctx), ctx's error
// (wrapped) otherwise; when Run's last calls failed (published rows not
// marked sent: they are published again once their leases expire; leases
// not released: their keys wait until they expire), an error saying so,
// wrapping the database's. Close without Run releases the scheduler. Close is
// idempotent; only the first call's ctx bounds the drain: a later call
// returns Run's result once Run returned, or, when its own ctx ends first,
// an error wrapping ctx's error that says another Close is still running.
// A nil ctx gets ErrNilContext.
func (r *Relay) Close(ctx context.Context) error {
	if r.zero() {
		return ErrZeroRelay
	}
	if ctx == nil {
		return keysched.ErrNilContext
	}
	first := false
	r.closeOnce.Do(func() {
		first = true
		r.closeCtx = ctx
		close(r.closing)
	})
	if r.started.CompareAndSwap(0, closedUnrun) {
		close(r.done)
		return r.sched.Close(ctx)
	}
	// Run's result when it has returned, whatever ctx (a select would pick
	// at random between the two when both are ready).
	ranErr := func() error {
		if r.shutdownErr != nil {
			return fmt.Errorf("outbox: close: %w", r.shutdownErr)
		}
		return nil
	}
	select {
	case <-r.done:
		return ranErr()
	default:
	}
	select {
	case <-r.done:
		return ranErr()
	case <-ctx.Done():
	}
	if !first {
		// Only the first call's ctx bounds the shutdown: nothing was
		// cancelled or given back for this one.
		select {
		case <-r.done:
			return ranErr()
		default:
		}
		return fmt.Errorf("outbox: close: another Close is still running (its context, not this one's, bounds the shutdown): %w", ctx.Err())
	}
	grace := time.NewTimer(keysched.CloseGrace)
	defer grace.Stop()
	select {
	case <-r.done:
		err := fmt.Errorf("outbox: close: the context ended before the relay stopped: sink calls in progress were cancelled, and the rows not published were given back (they stay pending: the next relay to claim their keys publishes them): %w", ctx.Err())
		if r.shutdownErr != nil {
			err = errors.Join(err, fmt.Errorf("outbox: close: %w", r.shutdownErr))
		}
		return err
	case <-grace.C:
	}
	r.mu.Lock()
	running := r.active
	r.mu.Unlock()
	if running > 0 {
		return fmt.Errorf("outbox: close: %d sink calls still running (ignoring their cancelled context), left to finish in the background: %w", running, ctx.Err())
	}
	// Run is marking what was published and releasing its leases: the
	// database is slow or away. Those calls go on in the background, each
	// bounded by callTimeout.
	return fmt.Errorf("outbox: close: still marking published rows and releasing leases (the database is slow or away; last: %w), left to finish in the background: %w", r.lastDBError(), ctx.Err())
}

func (r *Relay) beginTask() {
	r.mu.Lock()
	r.active++
	r.mu.Unlock()
}

func (r *Relay) endTask() {
	r.mu.Lock()
	r.active--
	if r.active == 0 { // and so active+marking, when marking is 0
		r.idle.Broadcast()
	}
	r.mu.Unlock()
}

// beginMark counts a dead mark in progress, unless Run is stopping (then it
// reports false: the row is given back, not marked). The check and the
// count are one step under r.mu, so that waitTasksUntil, which Run calls
// after it set stopping, either sees the mark counted or the mark sees
// stopping.
func (r *Relay) beginMark() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping.Load() {
		return false
	}
	r.marking++
	return true
}

func (r *Relay) endMark() {
	r.mu.Lock()
	r.marking--
	if r.active+r.marking == 0 {
		r.idle.Broadcast()
	}
	r.mu.Unlock()
}

// waitTasksUntil waits until no sink call runs and no dead mark is in
// progress, or ctx ends.
func (r *Relay) waitTasksUntil(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() {
		r.mu.Lock()
		r.idle.Broadcast()
		r.mu.Unlock()
	})
	defer stop()
	r.mu.Lock()
	for r.active+r.marking > 0 && ctx.Err() == nil {
		r.idle.Wait()
	}
	r.mu.Unlock()
}

func (r *Relay) waitTasks() {
	r.mu.Lock()
	for r.active > 0 {
		r.idle.Wait()
	}
	r.mu.Unlock()
}

// loop polls until runCtx ends, Close is called, or the database stays
// away longer than WithMaxOutage. Its database calls use ctx (runCtx, also
// cancelled when Close's context ends).
func (r *Relay) loop(ctx, runCtx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-runCtx.Done():
			return runCtx.Err()
		case <-r.closing:
			return nil
		default:
		}
		fails, oks := r.health.total.Load(), r.okCalls.Load()
		began := r.mono()
		full, idle := r.poll(ctx)
		if r.afterPoll != nil {
			r.afterPoll(began, full, idle)
		}
		wait := r.cfg.poll
		if !idle {
			r.lastRows = r.mono()
			// Its rows may take long to settle (a slow sink), and a busy
			// relay is not notified: look again within idleConfirm, so
			// that a poll finding nothing then makes the relay idle
			// (writers notify it) instead of sleeping a poll interval
			// while other keys' rows wait.
			wait = min(wait, idleConfirm)
		} else if r.health.total.Load() == fails {
			if since := time.Duration(r.mono() - r.lastRows); r.lastRows != 0 && since < idleConfirm {
				// Rows were found just before: a steady stream between
				// two of its rows, not an idle relay. Look again soon
				// rather than make writers notify (each notifying
				// commit serialises with every other).
				wait = min(wait, idleConfirm-since)
			} else if r.goIdle(ctx) {
				continue // just told writers to notify: look once more before sleeping
			}
		}
		if r.health.total.Load() == fails && r.okCalls.Load() != oks {
			r.dbOK(groupPoll)
		} else if err := r.outageOver(); err != nil {
			return err
		}
		if full {
			continue // a full batch: there may be more at once
		}
		timer.Reset(wait)
		select {
		case <-runCtx.Done():
			return runCtx.Err()
		case <-r.closing:
			return nil
		case <-r.wake:
			// Woken by rows settling while busy: the next poll comes
			// no sooner than pollPace after this one began.
			if d := time.Duration(began + int64(min(pollPace, r.cfg.poll)) - r.mono()); !idle && d > 0 {
				timer.Stop()
				timer.Reset(d)
				select {
				case <-runCtx.Done():
					return runCtx.Err()
				case <-r.closing:
					return nil
				case <-timer.C:
				}
			}
		case <-timer.C:
		}
	}
}

// pollPace is the shortest time between the starts of two polls of a busy
// relay (one that found rows) that did not fill its batch, or
// WithPollInterval if shorter. Each mark of published rows wakes the relay
// (its rows settled); without the pace, a relay keeping up with a steady
// stream polled after every mark, a few milliseconds apart, each poll a
// walk and a fetch (reads) and a mark (a commit) for the few rows that came
// in between. A full batch is followed by the next poll at once.
const pollPace = 10 * time.Millisecond

// idleConfirm is how long a relay must have found no row before it tells
// writers to notify it (goIdle): a poll finding nothing sooner after one
// that found rows is followed by another poll when this has passed (or
// WithPollInterval, if shorter), without the idle row.
const idleConfirm = 25 * time.Millisecond

// checkSchema checks, before Run claims anything, that the outbox and lease
// tables exist and have the columns the relay uses. A database that does not
// answer is retried every poll interval (an outage, bounded by
// WithMaxOutage); a missing schema is an error at once.
func (r *Relay) checkSchema(ctx context.Context) error {
	wait := time.NewTimer(time.Hour)
	defer wait.Stop()
	for {
		cctx, cancel := r.callCtx(ctx)
		var err error
		var which string
		for _, p := range []struct{ what, q string }{
			{r.o.table, r.o.q.probeTable},
			{r.o.table + "_lease", r.o.q.probeColumns},
			{r.o.table + "_lease_epoch", r.o.q.probeEpoch},
		} {
			if _, err = r.o.db.ExecContext(cctx, p.q); err != nil {
				which = p.what
				break
			}
		}
		cancel()
		switch {
		case err == nil:
			r.okCalls.Add(1)
			r.dbOK(groupPoll)
			return nil
		case which == r.o.table+"_lease" && sqldb.IsUndefinedColumn(err),
			which == r.o.table+"_lease_epoch" && sqldb.Classify(err) == sqldb.KindSchema:
			// A lease table of an older schema (no token or epoch
			// column, no epoch counter): claims would fail forever, and
			// a relay of an older version may be running on it.
			return fmt.Errorf("%w: %s: %w", ErrSchemaOutdated, which, err)
		case sqldb.Classify(err) == sqldb.KindSchema:
			return fmt.Errorf("%w: table %s: %w", ErrNoSchema, which, err)
		case ctx.Err() != nil:
			return ctx.Err()
		}
		r.dbError("check the schema", err)
		if err := r.outageOver(); err != nil {
			return err
		}
		wait.Reset(r.cfg.poll)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.closing:
			return ErrClosed
		case <-wait.C:
		}
	}
}

// poll does one round: renew leases when due, let ended tenures go, claim
// keys, fetch and submit their rows, delete expired sent rows when due. It
// reports whether the batch was filled (more may be waiting), and whether
// the relay is idle: it had room and found no row to fetch.
func (r *Relay) poll(ctx context.Context) (full, idle bool) {
	r.st.polls.Add(1)
	r.mu.Lock()
	room := r.cfg.batch - r.inflight
	r.mu.Unlock()
	r.releaseEnded(ctx, room <= 0)
	r.mu.Lock()
	room = r.cfg.batch - r.inflight
	held := len(r.keys) - len(r.lingering(nil))
	r.settled = 0
	r.mu.Unlock()
	if room > 0 {
		if held < r.cfg.maxKeys {
			r.acquire(ctx, room)
		}
		if r.beforeFetch != nil {
			r.beforeFetch()
		}
		n := r.fetch(ctx, room)
		full, idle = n == room, n == 0
		r.releaseEnded(ctx, n == room)
	}
	if r.cfg.retention > 0 && r.mono()-r.lastClean >= int64(max(r.cfg.poll*10, time.Second)) {
		r.cleanup(ctx)
	}
	return full, idle
}

// inTx runs fn in a transaction and commits it; on fn's error it rolls
// back and returns it.
func (r *Relay) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := r.o.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}
