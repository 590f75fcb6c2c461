package outbox_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A database whose round trips take longer than the relay's lease (a proxy
// in front of a private PostgreSQL holds every request 80 ms; the lease is
// 60 ms): the relay publishes nothing, and says why, once in its log (Warn)
// however long it lasts, and in Stats.SlowClaims and LapsedBeforeSink (every
// row fetched whose lease had ended: 4 a tenure, not only each tenure's first). Before, it claimed and
// lost its keys at every poll, silently (Stats showed only LeasesLost and
// Abandoned growing, as they do when another relay takes keys over). Once the latency is gone, it
// publishes every row, in order.
func TestLeaseShorterThanRoundTripIsReported(t *testing.T) {
	srv := dbtest.NewServer(t)
	ob := newOutbox(t, srv.Open(t))
	const keys, perKey = 3, 4
	writeEvents(t, ob, keys, perKey, keys)
	proxy := srv.LatencyProxy(t, 80*time.Millisecond)
	far, err := outbox.New(proxy.Open(t), outbox.WithTable(ob.Table()))
	require.NoError(t, err)
	logs := newLogLines()
	rec := newRecorder(keys * perKey)
	r, _ := startRelay(t, far, rec.sink, outbox.WithLogger(slog.New(logs)), outbox.WithLeaseDuration(60*time.Millisecond),
		outbox.WithPollInterval(10*time.Millisecond), outbox.WithListen(false))
	require.Eventually(t, func() bool { return r.Stats().SlowClaims >= 3 }, 30*time.Second, 5*time.Millisecond,
		"claims through the proxy take longer than the lease")
	// Every row fetched whose lease had ended is counted, not only a
	// tenure's first: each tenure here fetched its key's 4 rows.
	for st, end := r.Stats(), time.Now().Add(30*time.Second); st.LeasesLost < 2 || st.LapsedBeforeSink < 2*st.LeasesLost; st = r.Stats() {
		if time.Now().After(end) {
			t.Fatalf("LapsedBeforeSink does not count every row whose lease had ended (4 a tenure): %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	st := r.Stats()
	t.Logf("with 80 ms per round trip: %+v", st)
	require.Zero(t, st.Published, "no row can be published within a lease shorter than a round trip")
	require.Equal(t, 1, logs.count("claiming keys took a third of the lease or more"), "warned once (at most once a minute), not at every claim:\n%s", logs.dump())
	if st.LapsedBeforeSink > 0 { // rows fetched within the lease as the server saw it, started after it locally
		require.Equal(t, 1, logs.count("lease ended before its row was published"), "warned once:\n%s", logs.dump())
	}

	proxy.SetDelay(0)
	rec.wait(t, 30*time.Second)
	rec.check(t, keys, perKey)
	t.Logf("after: %+v", r.Stats())
}
