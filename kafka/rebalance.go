package kafka

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// onAssigned starts a new assignment (a new epoch) for each partition.
func (c *Consumer) onAssigned(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	if !c.made() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, ps := range m {
		for _, id := range ps {
			k := tp{t, id}
			if old := c.parts[k]; old != nil {
				old.state.Store(stGone)
				old.cancel()
			}
			c.parts[k] = newPartition(c, t, id, c.epoch.Add(1))
		}
	}
}

func (c *Consumer) take(m map[string][]int32) []*partition {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ps []*partition
	for t, ids := range m {
		for _, id := range ids {
			if p := c.parts[tp{t, id}]; p != nil {
				ps = append(ps, p)
			}
		}
	}
	return ps
}

func (c *Consumer) onRevoked(ctx context.Context, _ *kgo.Client, m map[string][]int32) {
	if !c.made() {
		return
	}
	c.revoke(ctx, c.take(m), true)
}

func (c *Consumer) onLost(ctx context.Context, _ *kgo.Client, m map[string][]int32) {
	if !c.made() {
		return
	}
	c.revoke(ctx, c.take(m), false)
}

// revoke ends the assignments ps: stop dispatching, wait (up to the revoke
// timeout; not when lost) for running handlers, interrupt what still runs,
// commit the frontiers (unless lost), drop queued and held records, clear
// pauses.
func (c *Consumer) revoke(ctx context.Context, ps []*partition, commit bool) {
	if len(ps) == 0 {
		return
	}
	for _, p := range ps {
		if !commit {
			p.noCommit.Store(true)
		}
		p.mu.Lock()
		p.state.CompareAndSwap(stActive, stRevoking)
		p.mu.Unlock()
	}
	// Lost partitions are not waited for: the group dropped this member,
	// another one may own them already and be handling the same records,
	// and nothing of them is committed here anyway.
	if commit {
		c.waitRunning(ps, c.cfg.revokeTimeout)
	}
	c.interrupt(ps)
	// End the interval commit in flight (see committer), so that commitMu
	// comes at once.
	c.revoking.Add(1)
	defer c.revoking.Add(-1)
	if f := c.intervalCancel.Load(); f != nil {
		(*f)()
	}
	c.commitMu.Lock()
	if commit {
		// Bounded by the revoke timeout and by Close giving up: a broker
		// that keeps refusing must not hold the rebalance (nor Close).
		// What it refused may be on it all the same (an answer that
		// timed out): read back within the same bound, as Close does.
		cctx, cancel := context.WithTimeout(ctx, c.cfg.revokeTimeout)
		stop := context.AfterFunc(c.give, cancel)
		failed := c.commitLocked(cctx, ps, "revoke")
		if failed = c.readBack(cctx, failed); len(failed) > 0 {
			c.log.Warn("kafka: revoke: frontiers not committed; the next owner handles their records again from the committed offset",
				"err", &CommitError{Partitions: failed})
		}
		stop()
		cancel()
	}
	c.unown(ps)
	c.commitMu.Unlock()
	c.forget(ps)
}

// unown removes ps from the owned set (c.commitMu held).
func (c *Consumer) unown(ps []*partition) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range ps {
		if c.parts[tp{p.topic, p.id}] == p {
			delete(c.parts, tp{p.topic, p.id})
		}
	}
}

// waitRunning waits until no handler of ps runs, d passes, or Close gives up.
func (c *Consumer) waitRunning(ps []*partition, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		busy := false
		for _, p := range ps {
			if p.running.Load() > 0 {
				busy = true
				break
			}
		}
		if !busy {
			return
		}
		select {
		case <-c.revokeWake:
		case <-t.C:
			return
		case <-c.give.Done():
			return
		}
	}
}

// interrupt stops the work of ps: the assignment's context ends (dead-letter
// produces stop), running handlers have their context cancelled, queued,
// waiting and parked records are withdrawn. None of them is finished.
func (c *Consumer) interrupt(ps []*partition) {
	for _, p := range ps {
		p.mu.Lock()
		p.state.Store(stGone)
		p.cancel()
		var last *group
		for _, it := range p.queue[p.head:] {
			if !it.isDone() && it.g != nil && it.g != last {
				last = it.g
				if comp := last.comp.Load(); comp != nil {
					comp.Cancel()
				}
			}
		}
		p.mu.Unlock()
	}
}

// forget cleans up after ps left the owned set: held records are dropped,
// pauses cleared, parked keys forgotten.
func (c *Consumer) forget(ps []*partition) {
	resume := map[string][]int32{}
	for _, p := range ps {
		p.mu.Lock()
		clear(p.held)
		p.held = nil
		if p.holding {
			p.holding = false
			c.holding.Add(-1)
		}
		if p.paused.Swap(false) {
			c.heldParts.Add(-1)
		}
		resume[p.topic] = append(resume[p.topic], p.id)
		p.mu.Unlock()
	}
	c.cl.ResumeFetchPartitions(resume)
	c.parkMu.Lock()
	for k, it := range c.parked {
		if it.p.state.Load() == stGone {
			delete(c.parked, k)
		}
	}
	c.parkMu.Unlock()
	c.failMu.Lock()
	for k, g := range c.failing {
		if g.p.state.Load() == stGone {
			delete(c.failing, k)
		}
	}
	c.failMu.Unlock()
}
