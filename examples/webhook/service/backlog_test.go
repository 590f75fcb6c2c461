package service

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBacklogBookkeeping(t *testing.T) {
	b := newBacklog(3, []string{"p", "q"})
	t0 := time.Unix(1000, 0)
	require.False(t, b.reserve("nobody"))
	for i := range 3 {
		require.True(t, b.reserve("p"), i)
	}
	require.False(t, b.reserve("p"), "reservations count toward the bound")
	require.True(t, b.reserve("q"), "the bound is per partner")
	b.commit("p", "a", t0)
	b.commit("p", "b", t0.Add(time.Second))
	b.release("p")
	require.True(t, b.reserve("p"))
	b.commit("p", "c", t0.Add(2*time.Second))
	// A failed transaction drops its event; a delivery removes its event
	// and counts it; an unknown ID (a redelivery after a restart) is ignored.
	b.drop("p", "b")
	b.done("p", "a", true)
	b.done("p", "zzz", true)
	st := b.snapshot(t0.Add(10 * time.Second))
	require.Equal(t, "p", st[0].Partner)
	require.Equal(t, 1, st[0].Backlog)
	require.Equal(t, 8*time.Second, st[0].OldestAge, "the oldest left is c")
	require.Equal(t, uint64(2), st[0].Delivered)
	require.Equal(t, 1, b.total())
	b.done("p", "c", false)
	st = b.snapshot(t0)
	require.Zero(t, st[0].Backlog+st[1].Backlog)
	require.Zero(t, st[0].OldestAge)
	// The next event's delivery may come before anything else: commit happens
	// before the transaction, so the delivery finds it and nothing lingers.
	require.True(t, b.reserve("q"))
	b.commit("q", "x", t0)
	b.done("q", "x", true)
	require.Zero(t, b.total())
}
