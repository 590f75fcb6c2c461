package service

import (
	"context"
	"time"
)

// Group commit: intake requests hand their event to one committer goroutine,
// which writes every event waiting at that moment (up to maxBatch) in one
// transaction, outbox rows and intake records together, and answers each
// request when that transaction has committed. A request still waits only
// for its own commit (its 202 means "durable"), but N concurrent requests
// cost one transaction instead of N: with SQLite's single writer this is
// what lets intake keep up with a burst.

const maxBatch = 256

type acceptReq struct {
	env     Envelope
	payload []byte
	done    chan error // buffered: the committer never blocks on it
}

type committer struct {
	store *Store
	// settle is called once per request the committer took, with its
	// transaction's outcome, before the request is answered: the backlog's
	// bookkeeping happens even when the client has gone away meanwhile.
	settle func(env Envelope, err error)
	in     chan *acceptReq
	stop   chan struct{}
	done   chan struct{}
}

func newCommitter(st *Store, settle func(Envelope, error)) *committer {
	c := &committer{store: st, settle: settle, in: make(chan *acceptReq, maxBatch), stop: make(chan struct{}), done: make(chan struct{})}
	go c.run()
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

func (c *committer) run() {
	defer close(c.done)
	batch := make([]*acceptReq, 0, maxBatch)
	for {
		select {
		case r := <-c.in:
			batch = append(batch[:0], r)
		case <-c.stop:
			// Answer what is queued: nothing was written for them.
			for {
				select {
				case r := <-c.in:
					c.settle(r.env, ErrClosed)
					r.done <- ErrClosed
				default:
					return
				}
			}
		}
	more:
		for len(batch) < maxBatch {
			select {
			case r := <-c.in:
				batch = append(batch, r)
			default:
				break more
			}
		}
		// The requests' own contexts do not bound the transaction: one
		// client going away must not fail its batch-mates.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := c.store.acceptBatch(ctx, batch)
		cancel()
		for _, r := range batch {
			c.settle(r.env, err)
			r.done <- err
		}
		clear(batch)
	}
}

func (c *committer) close() {
	close(c.stop)
	<-c.done
}
