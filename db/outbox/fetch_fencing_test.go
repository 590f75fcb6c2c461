package outbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/keysched/keysched/db/internal/dbtest"
	"github.com/keysched/keysched/db/outbox"
)

// A relay holding a key (lingering after its first row) whose lease row was
// taken over in the database (another relay's token and a new epoch, which
// the relay learns of only at its next renewal, seconds later) fetches
// nothing more of the key: a row written to it then is not published by
// this relay, while a row of another key, in the same transaction, is. The
// fetch checks each key's claim (key, epoch, owner, token) against the lease
// table; on PostgreSQL it reads the relay's lease rows in one index range
// (owner, token) instead of one probe per held key.
func TestFetchReadsNothingOfAKeyWhoseLeaseWasTakenOver(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		ob := newOutbox(t, db)
		got := make(chan string, 10)
		r, _ := startRelay(t, ob, func(_ context.Context, e outbox.Event) error {
			got <- string(e.Payload)
			return nil
		}, outbox.WithLogger(quiet), outbox.WithPollInterval(time.Second))
		commitEvent(t, ob, "k", "first")
		require.Equal(t, "first", <-got)
		waitUntil(t, "first marked, k lingering", func() bool {
			st := r.Stats()
			return st.Marked == 1 && st.KeysHeld == 1
		})
		_, err := db.ExecContext(ctx, `UPDATE `+ob.Table()+`_lease SET owner = 'other', token = 'other', epoch = epoch + 1 WHERE key = 'k'`)
		require.NoError(t, err)

		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		for _, e := range []outbox.Event{{Key: "k", Payload: []byte("k after")}, {Key: "o", Payload: []byte("o")}} {
			_, err = ob.Write(ctx, tx, e)
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit())
		select {
		case p := <-got:
			require.Equal(t, "o", p, "a row of the key taken over was published")
		case <-time.After(30 * time.Second):
			t.Fatal("o not delivered")
		}
		// The fetch that read o read k too: the relay still held it.
		require.Equal(t, 2, r.Stats().KeysHeld)
		select {
		case p := <-got:
			t.Fatalf("%q published after the key's lease was taken over", p)
		case <-time.After(200 * time.Millisecond):
		}
	})
}
