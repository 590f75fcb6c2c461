package outbox

import "time"

// RelayStats is a snapshot of a relay's counters, read one by one.
type RelayStats struct {
	Published  uint64 // sink calls that returned nil
	SinkErrors uint64 // sink calls that returned an error or panicked (each retry counts)
	Marked     uint64 // published rows marked sent (or deleted)
	Dead       uint64 // rows this relay marked dead
	Abandoned  uint64 // rows given back unpublished or unmarked: lease lost or ended, key parked, shutdown
	LeasesLost uint64 // keys whose lease expired or was taken before this relay let it go
	// SlowClaims counts claims (one database call for a poll's new keys)
	// that took a third of the lease or more, LapsedBeforeSink rows whose
	// lease had ended before their sink call could start (they are left
	// for the key's next claim; this also grows when renewals fail, in a
	// database outage: see DBErrors). Either growing while the database
	// answers means the lease is short for its round trips (each is also
	// logged at Warn, at most once a minute): raise WithLeaseDuration. A
	// relay whose round trips take longer than the lease publishes
	// nothing, and these are what show it.
	SlowClaims       uint64
	LapsedBeforeSink uint64
	Polls            uint64 // poll iterations
	Notifications    uint64 // PostgreSQL NOTIFY wake-ups received
	DBErrors         uint64 // failed database calls (the relay retries; see DBErrorKinds)
	// DBErrorKinds splits DBErrors by kind (sqldb.Classify).
	DBErrorKinds DBErrorCounts
	// DBFailingFor is how long the database calls have been failing, with
	// no poll whose calls all succeeded since (0 while they succeed): for a
	// health check, compare it with the database's longest failover.
	DBFailingFor time.Duration
	KeysHeld     int // keys leased now
	InFlight     int // rows fetched and not yet settled
	// Listening is true while a PostgreSQL LISTEN for this outbox is
	// active (false on SQLite, with WithListen(false) or an Outbox made
	// with WithNotify(false), and while the
	// listening connection is being re-established).
	Listening bool
}

// Stats returns a snapshot of the relay's counters.
func (r *Relay) Stats() RelayStats {
	if r.zero() {
		return RelayStats{}
	}
	r.mu.Lock()
	inflight := r.inflight
	r.mu.Unlock()
	failing, _, _, _ := r.outage()
	return RelayStats{
		DBErrorKinds: r.health.counts(), DBFailingFor: failing,
		Published: r.st.published.Load(), SinkErrors: r.st.sinkErrors.Load(),
		Marked: r.st.marked.Load(), Dead: r.st.dead.Load(), Abandoned: r.st.abandoned.Load(),
		LeasesLost: r.st.leasesLost.Load(), Polls: r.st.polls.Load(),
		SlowClaims: r.st.slowClaims.Load(), LapsedBeforeSink: r.st.lapsedBeforeSink.Load(),
		Notifications: r.st.notifications.Load(), DBErrors: r.st.dbErrors.Load(),
		KeysHeld: int(r.st.keysHeld.Load()), InFlight: inflight,
		Listening: r.st.listening.Load(),
	}
}
