package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// Resume, Skip and SkipHead refuse a key no event can have (ErrInvalidKey,
// not ErrNotParked), and a closed Relay's return ErrClosed.
func TestResumeSkipBadKeyAndAfterClose(t *testing.T) {
	ctx := context.Background()
	ob := newOutbox(t, dbtest.SQLite(t))
	for _, k := range []string{"", "k\x00", "k\xff", strings.Repeat("k", outbox.MaxKeyLen+1)} {
		require.ErrorIs(t, ob.Resume(ctx, k), outbox.ErrInvalidKey, "%q", k)
		require.ErrorIs(t, ob.Skip(ctx, k), outbox.ErrInvalidKey, "%q", k)
		_, err := ob.SkipHead(ctx, k)
		require.ErrorIs(t, err, outbox.ErrInvalidKey, "%q", k)
	}
	require.ErrorIs(t, ob.Resume(ctx, "k"), outbox.ErrNotParked)

	r, err := ob.NewRelay(func(context.Context, outbox.Event) error { return nil }, outbox.WithLogger(quiet))
	require.NoError(t, err)
	require.ErrorIs(t, r.Resume(ctx, ""), outbox.ErrInvalidKey)
	require.ErrorIs(t, r.Resume(ctx, "k"), outbox.ErrNotParked)
	require.NoError(t, r.Close(ctx))
	require.ErrorIs(t, r.Resume(ctx, "k"), outbox.ErrClosed)
	require.ErrorIs(t, r.Skip(ctx, "k"), outbox.ErrClosed)
	_, err = r.SkipHead(ctx, "k")
	require.ErrorIs(t, err, outbox.ErrClosed)
}
