package service

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A sync replaces the partner's list with the database's undelivered
// events, except what the snapshot could not know: an event whose intake
// transaction is open or settled since the sync began stays; one finished
// here since the sync began does not come back; one settled before and
// absent from the database (delivered by another instance) goes.
func TestBacklogSyncKeepsWhatTheSnapshotCannotSee(t *testing.T) {
	at := time.Unix(1000, 0)
	b := newBacklog(100, []string{"p"})
	ids := func() []string {
		var out []string
		b.mu.Lock()
		defer b.mu.Unlock()
		for e := b.partners["p"].order.Front(); e != nil; e = e.Next() {
			out = append(out, e.Value.(pendingEvent).id)
		}
		return out
	}
	b.commit("p", "delivered-elsewhere", at)
	b.settled("delivered-elsewhere")
	b.commit("p", "open-tx", at)
	b.commit("p", "delivered-here", at)
	b.settled("delivered-here")
	b.beginSync()
	b.commit("p", "late", at)
	b.settled("late")
	b.done("p", "delivered-here", true)
	snap := newBacklog(100, []string{"p"})
	snap.load("p", "theirs", at)
	snap.load("p", "delivered-here", at) // read before its delivery
	b.applySync(snap)
	require.Equal(t, []string{"theirs", "open-tx", "late"}, ids())
	// A failed read changes nothing and ends the sync.
	b.beginSync()
	b.applySync(nil)
	require.Equal(t, []string{"theirs", "open-tx", "late"}, ids())
	require.False(t, b.sync.active)
}
