package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Close stops fetching, waits until the dispatched records are finished or
// ctx ends (or until only parked keys' records are left: Resume and Skip
// refuse once Close has started; the records a Skip or a failure moved a
// key on to count as dispatched, and are dispatched when their key has room), interrupts what is left (those records are not finished: the
// next owner handles them), commits the frontiers, leaves the group, closes
// the client and the scheduler.
//
// It returns nil when everything dispatched finished and every frontier was
// committed. Otherwise its error says what it could not do, both when both
// happened (errors.Join): records left unfinished (an error wrapping ctx's
// error that says how many, or, when only parked keys held them, one
// wrapping ErrLeftParked that says how many keys were parked), and frontiers it could not commit (a
// *CommitError, matched by errors.Is(err, ErrNotCommitted), listing each
// partition with the broker's error). Before reporting them it reads the
// group's offsets back from the broker (within the time it has to leave the
// group): a frontier the broker holds after all (a commit applied though
// its answer said REQUEST_TIMED_OUT) is not reported, and each reported
// partition's Committed is the offset the broker holds (its last known
// one when the read fails). A commit the broker refuses with a
// retriable error (the coordinator moving or loading, a timeout) is sent
// again, 50 ms doubling to 1 s apart, until it succeeds or the commit's time
// ends; the final commit gets up to a second past ctx (with a ctx that
// never ends, Close waits for it as it waits for the records). Close returns within
// ctx plus CloseMargin whatever the brokers do (it never works through
// failed commits past that), Run returns nil, and later calls return the
// first one's result (a call made while the first one runs returns it too,
// or, when its own ctx ends first, an error wrapping ctx's error that says
// another Close is still running). When Close returns, the consumer's goroutines have
// ended, except handlers that ignore their context. Do not call it from a
// Handler.
func (c *Consumer) Close(ctx context.Context) error {
	if c.zero() {
		return ErrZeroConsumer
	}
	if ctx == nil {
		return ErrNilContext
	}
	c.closeMu.Lock()
	if c.closed {
		c.closeMu.Unlock()
		// Another Close runs (or ran): its result, or ctx's error when ctx
		// ends first, so that this call keeps its own bound.
		select {
		case <-c.closeDone:
			return c.closeErr
		case <-ctx.Done():
			select {
			case <-c.closeDone:
				return c.closeErr
			default:
			}
			return fmt.Errorf("kafka: close: another Close is still running: %w", ctx.Err())
		}
	}
	c.closed = true
	c.closeMu.Unlock() // Run checks closed under it: it starts before this or not at all
	defer close(c.closeDone)
	c.closing.Store(true)
	close(c.stop)
	c.bgCancel() // an interval commit in flight: the final commit below replaces it
	stopGiveUp := context.AfterFunc(ctx, c.giveUp)
	defer stopGiveUp()
	// The final commit's and leaving's bounds count from when ctx ends
	// (from now if it has ended), not from when each step starts: with an
	// ended ctx they would add up past CloseMargin.
	cctx, cancel := pastEnd(ctx, finalCommitGrace)
	defer cancel()
	lctx, lcancel := pastEnd(ctx, leaveGrace)
	defer lcancel()
	c.wake()
	if c.running.Load() {
		<-c.runDone
	}
	c.bg.Wait()

	var errs []error
	if parked, derr := c.drainUnparked(ctx); derr != nil {
		n := 0
		for _, p := range c.owned() {
			n += int(p.inflight.Load())
		}
		if parked > 0 {
			ofParked, others, keys := c.parkedLeft()
			msg := fmt.Sprintf("%d records unfinished, held by %d parked keys", ofParked, keys)
			if others > 0 {
				// Held back when the scheduler (full with the parked
				// keys' records) or their key refused them, and not
				// dispatched since: the poll loop, which dispatches
				// held records, ended when Close started.
				msg += fmt.Sprintf(", and %d records of other keys held back (never dispatched: the scheduler or their key was full)", others)
			}
			errs = append(errs, fmt.Errorf("%w: %s (Resume and Skip refuse once Close has started; the next owner handles them)", ErrLeftParked, msg))
		} else {
			errs = append(errs, fmt.Errorf("kafka: close: %d records unfinished (the next owner handles them): %w", n, ctx.Err()))
		}
	}
	ps := c.owned()
	for _, p := range ps {
		p.state.CompareAndSwap(stActive, stRevoking)
	}
	c.interrupt(ps)
	// The final commit gets a second of its own past ctx (also when ctx
	// ended while draining).
	c.commitMu.Lock()
	failed := c.finalCommit(cctx, ps)
	c.unown(ps)
	c.commitMu.Unlock()
	cancel()
	// What the broker refused may be on it all the same (an answer that
	// timed out): read it back, within leaving's time.
	failed = c.readBack(lctx, failed)
	if len(failed) > 0 {
		slices.SortFunc(failed, func(a, b UncommittedPartition) int {
			if a.Topic != b.Topic {
				return strings.Compare(a.Topic, b.Topic)
			}
			return int(a.Partition - b.Partition)
		})
		errs = append(errs, &CommitError{Partitions: failed})
	}
	c.forget(ps)
	// Leaving the group is bounded too: a LeaveGroup (or a join in flight)
	// that the broker does not answer is given up, and the group drops
	// the member at its session timeout. franz-go's Close leaves again
	// when our leave has not begun yet, with the client's context (a
	// LeaveGroup read-timed-out and retried for up to 30 s), and it waits
	// for a leave begun: both are cut short by ending the client's
	// context (kgo.WithContext: franz-go fails the requests in flight
	// and sends no more), at once when leaving ran out of time, else
	// when franz-go's shutdown has had its second (closing its fetch
	// sessions, its last telemetry push).
	kctx, kcancel := pastEnd(ctx, leaveGrace+clientCloseGrace)
	stopK := context.AfterFunc(kctx, c.clientCancel)
	c.cl.AllowRebalance()
	if err := c.cl.LeaveGroupContext(lctx); err != nil {
		c.log.Warn("kafka: close: leaving the group failed; the group reassigns this member's partitions at its session timeout", "err", err)
	}
	if lctx.Err() != nil {
		c.clientCancel()
	}
	c.cl.CloseAllowingRebalance()
	stopK()
	kcancel()
	c.clientCancel()
	lcancel()
	sctx, scancel := pastEnd(ctx, schedCloseGrace)
	if serr := c.sched.Close(sctx); serr != nil && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("kafka: close: handlers still running: %w", serr))
	}
	scancel()
	if c.metrics != nil {
		c.metrics.stop()
	}
	c.closeErr = errors.Join(errs...)
	return c.closeErr
}

// drainUnparked drains the scheduler until ctx ends or every task left is
// held by a parked key (Resume and Skip refuse once Close has started, so
// nothing would move them: Drain would wait for ever); it then returns the
// number of parked keys and a non-nil error, as it does when ctx ended
// with only parked keys' records left. It looks every 10 ms, dispatches
// the held groups of records handed on (dispatchHandedOn) and waits for
// them too, and leaves no goroutine behind.
func (c *Consumer) drainUnparked(ctx context.Context) (parked int, _ error) {
	for {
		parked, err := c.drainOnce(ctx)
		// Drained: records handed on to a group held back (a Skip, or a
		// group's later records after a failure, finding the key full)
		// were dispatched, and are waited for too.
		if err != nil || !c.dispatchHandedOn() {
			return parked, err
		}
	}
}

// drainOnce is one of drainUnparked's waits.
func (c *Consumer) drainOnce(ctx context.Context) (parked int, _ error) {
	dctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-dctx.Done():
				return
			case <-t.C:
			}
			if c.dispatchHandedOn() {
				continue
			}
			// Dispatched after the look: nothing runs once only parked
			// keys' records are left, so nothing hands records on after it.
			if n := c.onlyParkedLeft(); n > 0 && !c.dispatchHandedOn() {
				parked = n
				cancel(ErrLeftParked)
				return
			}
		}
	})
	err := c.sched.Drain(dctx)
	cancel(nil) // the looking stops
	wg.Wait()
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(dctx), ErrLeftParked) {
		return parked, err
	}
	if err != nil && ctx.Err() != nil {
		// ctx ended (maybe before the first look, as when Close is given
		// Run's ended context): what is left may still be only parked
		// keys' records, and that is what Close then says.
		if n := c.onlyParkedLeft(); n > 0 && !c.dispatchHandedOn() {
			return n, err
		}
	}
	return 0, err
}

// onlyParkedLeft returns the number of parked keys when every task the
// scheduler holds is held by one (none running, and nothing at work in an
// owned partition: a Skip writing its dead letter moves its key on), else
// 0.
func (c *Consumer) onlyParkedLeft() int {
	// No Resume or Skip is moving a key on: read under parkMu after
	// closing was set, so that one either took its key before this look
	// (and counts in moving until it returns) or is refused (takeParked).
	// Read first: the reads below are then of a scheduler that no Resume
	// or Skip changes. Read last, a Skip (or Resume) ending between them
	// and this one was missed: the scheduler was read with its key still
	// parked, and the record it moved the key on to was left.
	c.parkMu.Lock()
	moving := c.moving.Load()
	c.parkMu.Unlock()
	if moving > 0 {
		return 0
	}
	st := c.sched.Stats()
	if st.ParkedKeys == 0 || st.Running > 0 {
		return 0
	}
	for _, p := range c.owned() {
		if p.running.Load() > 0 {
			return 0
		}
	}
	keys := c.sched.Parked()
	held := 0
	for _, k := range keys {
		held += c.sched.KeyDepth(k)
	}
	if len(keys) == 0 || st.Pending > held {
		return 0
	}
	return len(keys)
}

// parkedLeft counts the unfinished records of the owned partitions: those
// of parked keys (the parked record, those queued or held behind it), the
// others (when only parked keys' records are left, those held back, never
// dispatched), and the parked keys (of owned partitions).
func (c *Consumer) parkedLeft() (records, others, keys int) {
	c.parkMu.Lock()
	parked := make(map[schedKey]bool, len(c.parked))
	for k, it := range c.parked {
		if it.p.state.Load() != stGone {
			parked[k] = true
		}
	}
	c.parkMu.Unlock()
	for _, p := range c.owned() {
		p.mu.Lock()
		for _, it := range p.queue[p.head:] {
			switch {
			case it.isDone():
			case it.g != nil && parked[it.g.key]:
				records++
			default:
				others++
			}
		}
		p.mu.Unlock()
	}
	return records, others, len(parked)
}

// finalCommit commits the frontiers of ps, sending those the broker refused
// with a retriable error again (50 ms doubling to 1 s apart) until ctx ends;
// it returns those it could not commit (c.commitMu held).
func (c *Consumer) finalCommit(ctx context.Context, ps []*partition) []UncommittedPartition {
	backoff := 50 * time.Millisecond
	for {
		failed := c.commitLocked(ctx, ps, "close")
		if len(failed) == 0 || ctx.Err() != nil || !slices.ContainsFunc(failed, func(f UncommittedPartition) bool { return retriableCommit(f.Err) }) {
			return failed
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return failed
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// pastEnd returns a context that ends d after ctx ends (d from now when ctx
// has already ended), with ctx's values.
func pastEnd(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	out, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var mu sync.Mutex
	var t *time.Timer
	done := false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			t = time.AfterFunc(d, cancel)
		}
	})
	return out, func() {
		stop()
		mu.Lock()
		done = true
		if t != nil {
			t.Stop()
		}
		mu.Unlock()
		cancel()
	}
}
