package service

import (
	"context"
	"time"
)

// maxBatch bounds one group commit's batch.
const maxBatch = 256

// groupCommit is the loop behind the intake's committer and the attempt
// history: requests queue on in; one goroutine takes every request waiting
// at that moment (up to maxBatch), writes them with one call of write (one
// transaction), and answers each with that call's outcome. After close it
// answers what is still queued with ErrClosed, writing nothing for them.
// Each request taken is answered exactly once.
type groupCommit[R any] struct {
	write  func(ctx context.Context, batch []R) error
	answer func(r R, err error)
	in     chan R
	stop   chan struct{} // closed by close: take no more
	done   chan struct{} // closed when run has exited
}

func newGroupCommit[R any](write func(context.Context, []R) error, answer func(R, error)) *groupCommit[R] {
	g := &groupCommit[R]{write: write, answer: answer, in: make(chan R, maxBatch), stop: make(chan struct{}), done: make(chan struct{})}
	go g.run()
	return g
}

func (g *groupCommit[R]) run() {
	defer close(g.done)
	batch := make([]R, 0, maxBatch)
	for {
		select {
		case r := <-g.in:
			batch = append(batch[:0], r)
		case <-g.stop:
			// Answer what is queued: nothing was written for them.
			for {
				select {
				case r := <-g.in:
					g.answer(r, ErrClosed)
				default:
					return
				}
			}
		}
	more:
		for len(batch) < maxBatch {
			select {
			case r := <-g.in:
				batch = append(batch, r)
			default:
				break more
			}
		}
		// The requests' own contexts do not bound the transaction: one
		// caller going away must not fail its batch-mates.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := g.write(ctx, batch)
		cancel()
		for _, r := range batch {
			g.answer(r, err)
		}
		clear(batch)
	}
}

// close stops taking requests and returns once every request taken was
// answered.
func (g *groupCommit[R]) close() {
	close(g.stop)
	<-g.done
}
