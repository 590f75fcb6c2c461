package keysched

// Regression tests for Close's abort path, first written as failing
// reproducers while building the bus package on the scheduler.

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Close whose context has ended must return, even while a task that ignores
// its context is running: "A task that ignores its context keeps its worker
// until it returns" (Close's doc). When that task's key has a queued
// successor, abortChain walks head -> successors -> tail; the tail is now
// done, the head pointer still names the running task (h != n), so it jumps
// back to the head and walks the same nodes again, forever, until the
// running task returns: Close spins at 100% CPU instead of returning.
func TestCloseAbortReturnsWhileAKeyedTaskRuns(t *testing.T) {
	s, err := New[string](WithWorkers(1))
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	defer close(release) // lets the spinning Close finish when the test ends
	started := make(chan struct{})
	if _, err := s.Submit(context.Background(), "k", func(context.Context) error {
		close(started)
		<-release // ignores its context
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(context.Background(), "k", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	<-started

	ended, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	go func() { done <- s.Close(ended) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Close with an ended context and a queued task returned nil")
		}
	case <-time.After(5 * time.Second): // a deadlock guard, not a timing assertion
		t.Fatal("Close(ended ctx) did not return while the key's head task runs: abortChain loops over the chain")
	}
}

// A dead letter must carry its task ("the original work, so it can be
// replayed on purpose"). Close's abortNode moves a queued task to
// stFinishing and only then reads c.task for the dead letter; a runner that
// reaches the node meanwhile takes it for a tombstone, advances past it and
// cleared n.task (advance used to). The dead letter then
// has a nil Task (the bus loses the event's envelope), and the race detector
// reports the read in deadLetter against the write in advance.
func TestAbortedDeadLetterKeepsItsTask(t *testing.T) {
	for range 50 {
		var mu sync.Mutex
		letters, nilTasks := 0, 0
		all := make(chan struct{})
		const queued = 20
		s, err := New[string](WithWorkers(1), WithDeadLetter(func(dl DeadLetter[string]) {
			mu.Lock()
			defer mu.Unlock()
			letters++
			if dl.Task == nil {
				nilTasks++
			}
			if letters == queued+1 {
				close(all)
			}
		}))
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan struct{})
		if _, err := s.Submit(context.Background(), "k", func(ctx context.Context) error {
			close(started)
			<-ctx.Done() // respects its context: Close's abort cancels it
			return ctx.Err()
		}); err != nil {
			t.Fatal(err)
		}
		for range queued {
			if _, err := s.Submit(context.Background(), "k", func(context.Context) error { return nil }); err != nil {
				t.Fatal(err)
			}
		}
		<-started
		ended, cancel := context.WithCancel(context.Background())
		cancel()
		_ = s.Close(ended)
		select {
		case <-all:
		case <-time.After(5 * time.Second): // a deadlock guard
			t.Fatal("not every task was dead-lettered")
		}
		mu.Lock()
		n := nilTasks
		mu.Unlock()
		if n > 0 {
			t.Fatalf("%d of %d aborted tasks were dead-lettered with a nil Task", n, queued)
		}
	}
}
