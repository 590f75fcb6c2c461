package outbox_test

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A busy relay (its poll found rows, without filling its batch) starts its
// next poll 10 ms (pollPace) after the last one began at the soonest, not
// at each mark of its published rows: each poll is a walk, a fetch and a
// mark (a commit) for the rows that came in between. Before, a relay
// keeping up with rows committed back to back polled after every mark,
// 1 to 5 ms apart.
//
// On PostgreSQL only: the pace is the loop's, whatever the database, and
// a SQLite relay (no NOTIFY; its writer waits for the one write lock) saw
// the rows in one or two polls.
func TestBusyRelayPollsAtMostEveryPace(t *testing.T) {
	db := dbtest.Postgres(t)
	ob := newOutbox(t, db)
	const rows = 100
	rec := newRecorder(rows)
	r, err := ob.NewRelay(rec.sink, outbox.WithLogger(quiet), outbox.WithPollInterval(time.Second))
	require.NoError(t, err)
	type poll struct {
		began      time.Duration
		full, idle bool
	}
	var mu sync.Mutex
	var polls []poll
	outbox.OnPoll(r, func(began time.Duration, full, idle bool) {
		mu.Lock()
		polls = append(polls, poll{began, full, idle})
		mu.Unlock()
	})
	runRelay(t, r)
	for i := range rows {
		commitEvent(t, ob, key(i%5), strconv.Itoa(i))
	}
	rec.wait(t, 30*time.Second)
	// On a loaded machine the relay's first look may come after every row
	// was committed, and one poll take them all: wait for the poll after
	// it (a busy relay looks again within 25 ms).
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for i := 1; i < len(polls); i++ {
			if p := polls[i-1]; !p.idle && !p.full {
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "no poll followed one that found rows")
	mu.Lock()
	defer mu.Unlock()
	busy := 0
	for i := 1; i < len(polls); i++ {
		if p := polls[i-1]; !p.idle && !p.full {
			busy++
			require.GreaterOrEqual(t, polls[i].began-p.began, 10*time.Millisecond,
				"poll %d began %v after poll %d, which found rows", i, polls[i].began-p.began, i-1)
		}
	}
	t.Logf("%d polls, %d after a poll that found rows", len(polls), busy)
	require.Positive(t, busy, "no poll found rows: the test proved nothing")
}
