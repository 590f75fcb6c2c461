package keysched

import (
	"context"
	"errors"
	"fmt"
)

// A BatchItem is one task of a batch: the key it is ordered by and its
// function.
type BatchItem[K comparable] struct {
	Key  K
	Task Task
}

// SubmitBatch accepts the tasks of items, in order, as len(items) calls of
// Submit would, for less: one admission against WithMaxPending for the
// batch, one allocation for all its tasks, and consecutive items of one key
// appended to that key's chain together. It is the call for what arrives in
// batches (a Kafka fetch, a bus publish loop).
//
// Order: tasks of one key run in the order of items, after that key's tasks
// accepted before the call, and before those accepted after it returns (as
// for single submissions; batches submitted concurrently interleave per key
// in some order, each keeping its own).
//
// Waiting: like Submit, it waits while the scheduler is at its pending bound
// or a key at its depth bound, until there is room or ctx ends. A batch
// larger than WithMaxPending is accepted in parts, each as soon as it fits.
// With a task's context it never waits (see Submit).
//
// Partial acceptance: the accepted tasks are always a prefix of items. The
// returned slice holds the Completion of each accepted task, in order:
// completions[i] is items[i]'s. When every task was accepted the error is
// nil and len(completions) == len(items). Otherwise the error says why
// items[len(completions)] was refused, wrapping ErrFull, ErrKeyFull, ErrClosed
// or ctx's error (errors.Is); the tasks before it are accepted and will run,
// the ones from it on are not: resubmit items[len(completions):] to go on in
// order.
//
// Bad input refuses the whole batch, before anything is accepted: a nil ctx
// (ErrNilContext), no items (ErrEmptyBatch), a nil task (ErrNilTask) or an
// invalid key (ErrInvalidKey), the error naming the item's index; a ctx
// already ended (its error); a Scheduler not made by New (ErrZeroScheduler).
//
// The batch's tasks share one allocation: a Completion kept after its task
// finished keeps its batch's nodes (about 80 bytes a task, without their
// task functions) reachable.
func (s *Scheduler[K]) SubmitBatch(ctx context.Context, items []BatchItem[K]) ([]*Completion, error) {
	return s.submitBatch(ctx, items, true)
}

// TrySubmitBatch is SubmitBatch without waiting: it accepts the longest
// prefix of items that fits now, and returns ErrFull, ErrKeyFull or ErrClosed
// (wrapped, see SubmitBatch) for the first item that does not.
func (s *Scheduler[K]) TrySubmitBatch(ctx context.Context, items []BatchItem[K]) ([]*Completion, error) {
	return s.submitBatch(ctx, items, false)
}

func (s *Scheduler[K]) checkBatch(ctx context.Context, items []BatchItem[K]) error {
	if s.zero() {
		return ErrZeroScheduler
	}
	if ctx == nil {
		return ErrNilContext
	}
	if len(items) == 0 {
		return ErrEmptyBatch
	}
	for i := range items {
		if items[i].Task == nil {
			return fmt.Errorf("keysched: batch item %d: %w", i, ErrNilTask)
		}
		if s.keyCheck && !validKey(items[i].Key) {
			return fmt.Errorf("keysched: batch item %d: %w", i, invalidKey(items[i].Key))
		}
	}
	return ctx.Err()
}

func (s *Scheduler[K]) submitBatch(ctx context.Context, items []BatchItem[K], wait bool) ([]*Completion, error) {
	if err := s.checkBatch(ctx, items); err != nil {
		if errors.Is(err, ErrZeroScheduler) {
			return nil, err
		}
		s.core.rejected.Add(uint64(len(items)))
		return nil, err
	}
	if s.cfg.taskAges {
		return s.submitEach(ctx, items, wait) // nodes with stamps: observe.go
	}
	if wait && inTask(ctx) {
		wait = false
	}
	nodes := make([]node[K], len(items))
	parent := withValues(ctx)
	for i := range items {
		n := &nodes[i]
		n.key, n.task, n.parent = items[i].Key, items[i].Task, parent
	}
	done := make([]*Completion, 0, len(items))
	var heads readyList[K]
	var err error
	i := 0
	for i < len(items) {
		// One admission for as many of the remaining tasks as fit. The heads
		// found so far go to runners first: the room may be theirs to free.
		s.dispatch(&heads)
		got, aerr := s.pending.acquireN(ctx, int64(len(items)-i), wait, s.closing)
		if aerr != nil {
			err = aerr
			break
		}
		s.core.submitted.Add(got)
		end := i + int(got)
		var full *chainHdr
		for i < end {
			j := i + 1
			for j < end && nodes[j].key == nodes[i].key {
				j++
			}
			m, head, f := s.tails.appendRun(nodes[i:j], s.maxKeyDepth, &s.core)
			for k := i; k < i+m; k++ {
				done = append(done, &nodes[k].Completion)
			}
			if m > 0 {
				if s.core.aborting.Load() {
					// As in submit: Close's abort walked the key before
					// these were linked, or they see the flag here.
					for k := i; k < i+m; k++ {
						s.abortNode(&nodes[k])
					}
				}
				if head {
					heads.add(&nodes[i])
				}
			}
			i += m
			if f != nil {
				full = f
				break
			}
		}
		if unused := end - i; unused > 0 {
			s.core.submitted.Add(-int64(unused))
			s.pending.releaseN(int64(unused))
		}
		if full != nil {
			if !wait {
				err = ErrKeyFull
				break
			}
			s.dispatch(&heads)
			if werr := s.waitKey(ctx, full); werr != nil {
				err = werr
				break
			}
		}
	}
	s.dispatch(&heads)
	if err != nil {
		s.core.rejected.Add(uint64(len(items) - i))
		return done, fmt.Errorf("keysched: batch: %d of %d tasks accepted, item %d refused: %w", i, len(items), i, err)
	}
	return done, nil
}

// readyList collects the heads of new chains found while a batch is
// appended, to go into the ready queue together.
type readyList[K comparable] struct {
	head, tail *node[K]
	n          int
}

func (l *readyList[K]) add(n *node[K]) {
	n.readyNext = nil
	if l.tail == nil {
		l.head = n
	} else {
		l.tail.readyNext = n
	}
	l.tail = n
	l.n++
}

// dispatch moves l into the ready queue (one lock) and starts runners for it.
func (s *Scheduler[K]) dispatch(l *readyList[K]) {
	if l.n == 0 {
		return
	}
	s.ready.pushList(l.head, l.tail, l.n)
	for range l.n {
		if !s.workers.reserve() {
			break
		}
		s.workers.start()
	}
	*l = readyList[K]{}
}
