package service

import (
	"context"
)

// Group commit: intake requests hand their event to one committer goroutine,
// which writes every event waiting at that moment (up to maxBatch) in one
// transaction, outbox rows and intake records together, and answers each
// request when that transaction has committed. A request still waits only
// for its own commit (its 202 means "durable"), but N concurrent requests
// cost one transaction instead of N: with SQLite's single writer this is
// what lets intake keep up with a burst.

type acceptReq struct {
	env     Envelope
	payload []byte
	done    chan error // buffered: the committer never blocks on it
}

type committer struct {
	*groupCommit[*acceptReq]
	// settle is called once per request the committer took, with its
	// transaction's outcome, before the request is answered: the backlog's
	// bookkeeping happens even when the client has gone away meanwhile.
	settle func(env Envelope, err error)
}

func newCommitter(st *Store, settle func(Envelope, error)) *committer {
	c := &committer{settle: settle}
	c.groupCommit = newGroupCommit(st.acceptBatch, func(r *acceptReq, err error) {
		c.settle(r.env, err)
		r.done <- err
	})
	return c
}

// accept persists one event; it returns once the event's transaction has
// committed (nil) or failed, or ctx ended (the event may then still be
// committed: the client got no 202 and may retry; the retry is a new event).
// taken reports whether the committer took the request (then settle is or
// will be called for it; else the caller undoes its reservation).
func (c *committer) accept(ctx context.Context, env Envelope, payload []byte) (taken bool, err error) {
	r := &acceptReq{env: env, payload: payload, done: make(chan error, 1)}
	select {
	case <-c.stop:
		return false, ErrClosed
	default:
	}
	select {
	case c.in <- r:
	case <-c.stop:
		return false, ErrClosed
	case <-ctx.Done():
		return false, ctx.Err()
	}
	return true, c.wait(ctx, r)
}

func (c *committer) wait(ctx context.Context, r *acceptReq) error {
	select {
	case err := <-r.done:
		return err
	case <-c.done:
		// The committer has exited: it answered what it took, so a
		// request not answered by now was never written.
		// (A request that slipped into the channel after the drain is
		// not settled: settle it here, it was never written.)
		select {
		case err := <-r.done:
			return err
		default:
			c.settle(r.env, ErrClosed)
			return ErrClosed
		}
	case <-ctx.Done():
		return ctx.Err()
	}
}
