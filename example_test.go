package keysched_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/keysched/keysched"
)

// Tasks of one key run one at a time, in the order they were submitted;
// tasks of different keys run concurrently on the scheduler's workers.
func Example() {
	ctx := context.Background()
	s, err := keysched.New[string](keysched.WithWorkers(8))
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)

	var mu sync.Mutex
	balances := map[string]int{}
	for i, acct := range []string{"alice", "bob", "alice", "alice", "bob"} {
		amount := (i + 1) * 10
		_, err := s.Submit(ctx, acct, func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			balances[acct] += amount // alice: 10, then 30, then 40: always in that order
			return nil
		})
		if err != nil {
			panic(err)
		}
	}
	if err := s.Drain(ctx); err != nil {
		panic(err)
	}
	fmt.Println(balances["alice"], balances["bob"])
	// Output: 80 70
}

// A Completion reports one task's outcome.
func ExampleCompletion_Wait() {
	ctx := context.Background()
	s, _ := keysched.New[int]()
	defer s.Close(ctx)

	c, err := s.Submit(ctx, 42, func(context.Context) error {
		return errors.New("card declined")
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(c.Wait(ctx))
	// Output: card declined
}

// Cancel withdraws a task that has not started: it never runs, and its
// key's later tasks go on.
func ExampleCompletion_Cancel() {
	ctx := context.Background()
	s, _ := keysched.New[string]()
	defer s.Close(ctx)

	release := make(chan struct{})
	s.Submit(ctx, "order-7", func(context.Context) error { <-release; return nil })
	queued, _ := s.Submit(ctx, "order-7", func(context.Context) error {
		fmt.Println("never printed")
		return nil
	})
	queued.Cancel()
	fmt.Println(queued.Err())
	close(release)
	s.Drain(ctx)
	// Output: context canceled
}

// TrySubmit never waits: it reports a full key (or scheduler) at once, so the
// caller can shed load or retry later.
func ExampleScheduler_TrySubmit() {
	ctx := context.Background()
	s, _ := keysched.New[string](keysched.WithMaxKeyDepth(1))
	defer s.Close(ctx)

	release := make(chan struct{})
	s.Submit(ctx, "user-1", func(context.Context) error { <-release; return nil })
	_, err := s.TrySubmit(ctx, "user-1", func(context.Context) error { return nil })
	fmt.Println(errors.Is(err, keysched.ErrKeyFull))
	close(release)
	// Output: true
}

// Submit waits for room until its context ends; nothing is enqueued then.
func ExampleScheduler_Submit_backpressure() {
	ctx := context.Background()
	s, _ := keysched.New[string](keysched.WithMaxKeyDepth(1))
	defer s.Close(ctx)

	release := make(chan struct{})
	s.Submit(ctx, "hot", func(context.Context) error { <-release; return nil })

	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	_, err := s.Submit(waitCtx, "hot", func(context.Context) error { return nil })
	fmt.Println(errors.Is(err, keysched.ErrKeyFull), errors.Is(err, context.DeadlineExceeded))
	close(release)
	// Output: true true
}

// With a retry policy delivery is at-least-once: failed attempts are retried
// with exponential backoff and full jitter; when attempts run out the task
// goes to the dead letter.
func ExampleWithRetry() {
	ctx := context.Background()
	s, _ := keysched.New[string](
		keysched.WithRetry(keysched.RetryPolicy{
			MaxAttempts:    3,
			InitialBackoff: time.Millisecond,
			MaxBackoff:     10 * time.Millisecond,
		}),
		keysched.WithDeadLetter(func(dl keysched.DeadLetter[string]) {
			fmt.Println("dead letter:", dl.Key, dl.Attempts, dl.Err)
		}),
	)
	defer s.Close(ctx)

	c, _ := s.Submit(ctx, "webhook-9", func(ctx context.Context) error {
		fmt.Println("attempt", keysched.Attempt(ctx))
		return errors.New("503 from the endpoint")
	})
	c.Wait(ctx)
	// Output:
	// attempt 1
	// attempt 2
	// attempt 3
	// dead letter: webhook-9 3 503 from the endpoint
}

// With the Park policy a key whose task failed for good stops, keeping its
// later tasks, until Resume or Skip.
func ExampleWithFailurePolicy() {
	ctx := context.Background()
	parked := make(chan string, 1)
	s, _ := keysched.New[string](
		keysched.WithFailurePolicy(keysched.Park),
		keysched.WithDeadLetter(func(dl keysched.DeadLetter[string]) {
			parked <- dl.Key // the key is parked already
		}),
	)
	defer s.Close(ctx)

	healthy := make(chan struct{})
	first, _ := s.Submit(ctx, "ledger-3", func(context.Context) error {
		select {
		case <-healthy:
			return nil
		default:
			return errors.New("database down")
		}
	})
	second, _ := s.Submit(ctx, "ledger-3", func(context.Context) error { return nil })
	<-parked
	fmt.Println("parked:", s.Parked(), "depth:", s.KeyDepth("ledger-3"))

	close(healthy) // the database is back
	s.Resume("ledger-3")
	fmt.Println(first.Wait(ctx), second.Wait(ctx))
	// Output:
	// parked: [ledger-3] depth: 2
	// <nil> <nil>
}

// Close refuses new work at once, lets accepted tasks finish, and when its
// context ends first gives up on the tasks that have not started.
func ExampleScheduler_Close() {
	s, _ := keysched.New[string]()
	release := make(chan struct{})
	s.Submit(context.Background(), "slow", func(ctx context.Context) error {
		<-ctx.Done() // respects cancellation: Close's giving up cancels it
		close(release)
		return ctx.Err()
	})
	queued, _ := s.Submit(context.Background(), "slow", func(context.Context) error { return nil })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	err := s.Close(ctx)
	fmt.Println(errors.Is(err, keysched.ErrAborted), errors.Is(queued.Err(), keysched.ErrAborted))
	<-release
	_, err = s.Submit(context.Background(), "slow", func(context.Context) error { return nil })
	fmt.Println(err)
	// Output:
	// true true
	// keysched: scheduler closed
}

// A task may submit more work, to any key, its own included. With the
// context it was given, such a submission never waits for room: it fails
// fast instead, since waiting on the scheduler it runs on could deadlock.
func ExampleTask_submitFromTask() {
	ctx := context.Background()
	s, _ := keysched.New[string](keysched.WithWorkers(1))
	defer s.Close(ctx)

	done := make(chan struct{})
	s.Submit(ctx, "parent", func(taskCtx context.Context) error {
		_, err := s.Submit(taskCtx, "child", func(context.Context) error {
			close(done)
			return nil
		})
		return err
	})
	<-done
	fmt.Println("child ran")
	// Output: child ran
}

// Stats counts every task's outcome.
func ExampleScheduler_Stats() {
	ctx := context.Background()
	s, _ := keysched.New[int]()
	defer s.Close(ctx)
	for i := range 10 {
		s.Submit(ctx, i%3, func(context.Context) error {
			if i == 4 {
				return errors.New("bad")
			}
			return nil
		})
	}
	s.Drain(ctx)
	st := s.Stats()
	fmt.Println(st.Submitted, st.Succeeded, st.Failed, st.Pending, st.Keys)
	// Output: 10 9 1 0 0
}
