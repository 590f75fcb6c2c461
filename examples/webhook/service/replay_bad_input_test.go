package service

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Replay of the empty ID is ErrUnknownEvent, as Event's: it was taken for a
// range replay of partner "" over [zero, zero) and answered ErrReplayNothing
// (a 400 naming a partner "" nobody asked about).
func TestReplayOfTheEmptyIDIsUnknownEvent(t *testing.T) {
	ep := newScripted(t, func(int, string) (int, string) { return http.StatusNoContent, "" })
	h := newHarness(t, nil, func(c *Config) { c.Partners = map[string]string{"p": ep.srv.URL} })
	_, err := h.svc.Replay(context.Background(), "")
	require.ErrorIs(t, err, ErrUnknownEvent)
}

// A range bound outside years 1 to 9999 is ErrBadRange: a far "max time"
// upper bound overflowed the stored microseconds, and the replay of a range
// holding the partner's events answered ErrReplayNothing.
func TestReplayRangeRefusesBoundsItCannotStore(t *testing.T) {
	ep := newScripted(t, func(int, string) (int, string) { return http.StatusNoContent, "" })
	h := newHarness(t, nil, func(c *Config) { c.Partners = map[string]string{"p": ep.srv.URL} })
	h.postDelivered("p", 1)
	ctx := context.Background()
	now := time.Now()
	for _, r := range [][2]time.Time{
		{now.Add(-time.Hour), time.Unix(1<<62, 0)},
		{time.Date(-300000, 1, 1, 0, 0, 0, 0, time.UTC), now.Add(time.Hour)},
	} {
		res, err := h.svc.ReplayRange(ctx, "p", r[0], r[1])
		require.ErrorIs(t, err, ErrBadRange, "%v", r)
		require.Empty(t, res.Requeued)
	}
	require.Empty(t, h.event(h.acceptedIDs("p")[0]).Replays)
}
