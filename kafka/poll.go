package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Run fetches records and dispatches them to the scheduler until ctx ends or
// Close is called. It returns nil after Close, an error wrapping ctx's error
// when ctx ended (call Close then: it drains, commits and leaves the group),
// ErrRunning if Run was called before, ErrClosed if Close has started,
// ErrZeroConsumer for a Consumer not made by NewConsumer. The
// handlers' contexts carry ctx's values, not its cancellation.
//
// At its start, with WithDeadLetterTopic, Run asks the cluster whether it
// has the dead-letter topic (one metadata request, creating nothing) and
// returns an error wrapping ErrUnknownTopic, naming the topic, when it does
// not (or one wrapping the broker's error when the broker refuses the
// topic for good: unauthorized, invalid); call Close then. Client options
// with kgo.AllowAutoTopicCreation skip the check (the first dead letter
// creates the topic, if the brokers allow it). A cluster that does not
// answer, or answers with a retriable error, is logged at Warn and Run goes
// on: the dead-letter produce retries then, as it does for a topic deleted
// after the start.
//
// Run never blocks on a key: a record that finds its key (or the scheduler)
// full is held back, and its partition paused until room appears;
// heartbeats and rebalances go on meanwhile.
func (c *Consumer) Run(ctx context.Context) error {
	if c.zero() {
		return ErrZeroConsumer
	}
	if ctx == nil {
		return ErrNilContext
	}
	c.closeMu.Lock() // Close sets closed under it: Run starts before it or not at all
	if c.closed {
		c.closeMu.Unlock()
		return ErrClosed
	}
	if !c.running.CompareAndSwap(false, true) {
		c.closeMu.Unlock()
		return ErrRunning
	}
	c.runCtx = context.WithoutCancel(ctx)
	c.bg.Add(1)
	go c.committer()
	c.closeMu.Unlock()
	defer close(c.runDone)
	if err := c.checkDeadLetterTopic(ctx); err != nil {
		return err
	}
	var backoff time.Duration // after polls that brought only fetch errors
	for {
		if c.closing.Load() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("kafka: run: %w", err)
		}
		c.wakeReq.Store(false)
		c.dispatchHeld()
		if c.awaitRoom(ctx) {
			continue
		}
		pctx, cancel := context.WithCancel(ctx)
		c.pollCancel.Store(&cancel)
		if c.wakeReq.Load() || c.closing.Load() {
			cancel()
		}
		fetches := c.cl.PollRecords(pctx, c.cfg.maxPoll)
		c.room.polled = true
		c.pollCancel.Store(nil)
		cancel()
		if fetches.IsClientClosed() {
			c.cl.AllowRebalance()
			return nil
		}
		failed, cancelled := false, false
		fetches.EachError(func(t string, p int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				cancelled = true
				return
			}
			failed = true
			c.fetchLog.fail(err, "topic", t, "partition", p)
		})
		if !failed && !cancelled {
			c.fetchLog.ok()
		}
		fetches.EachPartition(c.route)
		c.cl.AllowRebalance()
		// franz-go hands some refused fetches (UNKNOWN_SERVER_ERROR) to
		// the poll at once and fetches again when polled: without a pause
		// the loop would spin, thousands of requests a second.
		if failed && fetches.NumRecords() == 0 {
			backoff = min(max(2*backoff, 10*time.Millisecond), 250*time.Millisecond)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-c.stop:
			case <-ctx.Done():
			}
			t.Stop()
		} else if !failed {
			backoff = 0
		}
	}
}

// wake makes the poll loop look at held records, paused partitions and
// partitions at their bound.
func (c *Consumer) wake() {
	if c.wakeReq.Swap(true) {
		return // already asked: one wake-up per poll
	}
	if f := c.pollCancel.Load(); f != nil {
		(*f)()
	}
	select {
	case c.wakeCh <- struct{}{}: // for awaitRoom
	default:
	}
}
