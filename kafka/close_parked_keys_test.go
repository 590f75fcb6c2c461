package kafka

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Close with a context that never ends returns although a key is parked:
// once Close has started, Resume and Skip refuse (ErrClosed), so nothing
// could finish the parked key's records. It drains the rest, says the
// parked records are left unfinished (their frontier is committed at the
// parked record: the next owner handles them), and returns. Before, it
// waited for the parked key for ever, and a later Close with a deadline
// only said "another Close is still running".
func TestCloseWithoutADeadlineLeavesParkedKeysToTheNextOwner(t *testing.T) {
	tc := newCluster(t, 1, "t")
	tc.produce(t, rec("t", 0, "a", "a0"), rec("t", 0, "a", "a1"), rec("t", 0, "b", "b0"))
	h := func(_ context.Context, r *kgo.Record) error {
		if string(r.Value) == "a0" {
			return errors.New("fails")
		}
		return nil
	}
	commits := tc.watchCommits(t)
	c, err := NewConsumer(h, WithLogger(quiet), WithCommitInterval(5*time.Millisecond),
		WithSchedulerOptions(keysched.WithFailurePolicy(keysched.Park)),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	eventually(t, "a parked, b handled", func() bool {
		ps, _ := c.partStats("t", 0)
		return len(c.Parked()) == 1 && ps.HighestFetched == 2 && c.Stats().Succeeded == 1
	})
	closed := make(chan error, 1)
	go func() { closed <- c.Close(context.Background()) }()
	select {
	case err = <-closed:
	case <-time.After(20 * time.Second):
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		t.Fatalf("Close(context.Background()) still waits for the parked key after 20 s (a later Close: %v)", c.Close(ctx))
	}
	if err == nil || !strings.Contains(err.Error(), "parked") {
		t.Errorf("Close: %v, want an error naming the parked key's records", err)
	}
	if err := <-ran; err != nil {
		t.Errorf("Run: %v", err)
	}
	if cs := commits.of("t", 0); len(cs) == 0 || cs[len(cs)-1].Offset != 0 {
		t.Errorf("commits %+v, want the last at the parked record, 0", cs)
	}
}
