package kafka

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// intervalCommitTimeout bounds an interval commit (franz-go's retries of a
// refused one included): 30 s, or a quarter of the group's rebalance
// timeout when that is less (at least 100 ms). franz-go does not rejoin the
// group while a commit is in flight, so a commit a failing broker keeps
// refusing would otherwise hold the member's rejoin past the rebalance
// timeout, and the group would drop it.
func intervalCommitTimeout(cl *kgo.Client) time.Duration {
	d := 30 * time.Second
	if rt, ok := cl.OptValue(kgo.RebalanceTimeout).(time.Duration); ok && rt > 0 {
		d = min(d, max(rt/4, 100*time.Millisecond))
	}
	return d
}

// committer commits the owned partitions' frontiers every commit interval
// until Close.
func (c *Consumer) committer() {
	defer c.bg.Done()
	t := time.NewTicker(c.cfg.commitInterval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			// Bounded, so that a broker that does not answer cannot hold
			// commitMu (and with it revokes) for ever, nor a rebalance:
			// franz-go does not join the group while a commit is in
			// flight, and a member that has not rejoined within the
			// rebalance timeout is dropped from the group.
			// Close ends it (bgCtx): it makes its own final commit.
			// A revoke ends it too, and none starts while one runs: the
			// revoke commits itself, and waiting for this commit (and
			// franz-go's retries of it) would hold the rebalance.
			ctx, cancel := context.WithTimeout(c.bgCtx, c.intervalCommitTimeout)
			c.intervalCancel.Store(&cancel)
			if c.revoking.Load() == 0 {
				c.commit(ctx, c.owned(), "interval")
			}
			c.intervalCancel.Store(nil)
			cancel()
		}
	}
}
