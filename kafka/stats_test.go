package kafka

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/keysched/keysched"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The adapter's own Stats count records; Stats().Scheduler counts groups
// (the records of one key from one poll are one task): 30 records of 3
// keys in one poll, two failing once, are 30 fetched, 30 succeeded, 2
// failed attempts, 30 finished, and fewer scheduler tasks than records.
func TestStatsCountRecords(t *testing.T) {
	tc := newCluster(t, 1, "t")
	var rs []*kgo.Record
	for i := range 30 {
		rs = append(rs, rec("t", 0, []string{"a", "b", "c"}[i%3], ""))
	}
	tc.produce(t, rs...)
	var mu sync.Mutex
	failed := map[int64]bool{}
	c := startConsumer(t, func(_ context.Context, r *kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		if (r.Offset == 4 || r.Offset == 20) && !failed[r.Offset] {
			failed[r.Offset] = true
			return errors.New("once")
		}
		return nil
	}, WithLogger(quiet), WithSchedulerOptions(keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond})),
		WithClientOptions(tc.clientOpts(groupName(t), "t")...))
	eventually(t, "30 records finished", func() bool { return c.Stats().Finished == 30 })
	st := c.Stats()
	if st.Fetched != 30 || st.Succeeded != 30 || st.FailedAttempts != 2 || st.InFlight != 0 || st.Held != 0 {
		t.Errorf("records: fetched %d, succeeded %d, failed attempts %d, in flight %d, held %d; want 30, 30, 2, 0, 0",
			st.Fetched, st.Succeeded, st.FailedAttempts, st.InFlight, st.Held)
	}
	if st.Scheduler.Succeeded >= 30 {
		t.Errorf("the scheduler counted %d tasks for 30 records in one poll: want groups (fewer)", st.Scheduler.Succeeded)
	}
}
