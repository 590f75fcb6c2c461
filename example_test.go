package keysched_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keysched/keysched"
	"github.com/panjf2000/ants/v2"
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
// A task that waits for a later task of its own key would wait forever (that
// task can run only after it returns): Wait, given the task's context, fails
// at once with ErrDeadlock. So does a wait that closes a cycle of waits
// through other keys.
func ExampleCompletion_Wait_deadlock() {
	ctx := context.Background()
	s, _ := keysched.New[string](keysched.WithLogger(slog.New(slog.DiscardHandler)))
	defer s.Close(ctx)

	c, _ := s.Submit(ctx, "account-1", func(tctx context.Context) error {
		later, err := s.Submit(tctx, "account-1", func(context.Context) error { return nil })
		if err != nil {
			return err
		}
		return later.Wait(tctx) // with the task's own context
	})
	fmt.Println(errors.Is(c.Wait(ctx), keysched.ErrDeadlock))
	// Output: true
}

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
	err := s.Close(ctx)         // returns within keysched.CloseGrace of ctx's end
	var ce *keysched.CloseError // what it gave up on, counted
	fmt.Println(errors.Is(err, keysched.ErrAborted), errors.As(err, &ce))
	// Done once its dead letter (here: logged) was delivered.
	fmt.Println(errors.Is(queued.Wait(context.Background()), keysched.ErrAborted))
	<-release
	_, err = s.Submit(context.Background(), "slow", func(context.Context) error { return nil })
	fmt.Println(err)
	// Output:
	// true true
	// true
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

// New checks its options: a bad one is an error, never a panic.
func ExampleNew() {
	s, err := keysched.New[string](
		keysched.WithWorkers(32),       // at most 32 tasks run at once
		keysched.WithMaxKeyDepth(100),  // queued + running tasks per key
		keysched.WithMaxPending(10000), // accepted, unfinished tasks in all
	)
	if err != nil {
		panic(err)
	}
	defer s.Close(context.Background())

	_, err = keysched.New[string](keysched.WithMaxKeyDepth(0))
	fmt.Println(errors.Is(err, keysched.ErrInvalidOption))
	fmt.Println(err)
	// Output:
	// true
	// keysched: invalid option: WithMaxKeyDepth(0): need at least 1
}

// Submit accepts a task for its key and returns its Completion at once; the
// task runs later, after the key's earlier tasks.
func ExampleScheduler_Submit() {
	ctx := context.Background()
	s, err := keysched.New[int]()
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)

	var log []string // one key: its tasks never run at the same time
	for _, step := range []string{"created", "paid", "shipped"} {
		_, err := s.Submit(ctx, 1001, func(context.Context) error {
			log = append(log, step)
			return nil
		})
		if err != nil { // not accepted: nothing will run
			panic(err)
		}
	}
	last, _ := s.Submit(ctx, 1001, func(context.Context) error { return nil })
	if err := last.Wait(ctx); err != nil {
		panic(err)
	}
	fmt.Println(log) // the key's earlier tasks happened before its last one
	// Output: [created paid shipped]
}

// Submit refuses what it cannot run, with an error saying why.
func ExampleScheduler_Submit_errors() {
	ctx := context.Background()
	s, _ := keysched.New[any]()

	_, err := s.Submit(ctx, "k", nil)
	fmt.Println(err)
	_, err = s.Submit(ctx, []int{1}, func(context.Context) error { return nil })
	fmt.Println(errors.Is(err, keysched.ErrInvalidKey))

	s.Close(ctx)
	_, err = s.Submit(ctx, "k", func(context.Context) error { return nil })
	fmt.Println(err)
	// Output:
	// keysched: nil task
	// true
	// keysched: scheduler closed
}

// Drain waits until every task accepted so far has finished, without closing
// the scheduler: it accepts more work afterwards.
func ExampleScheduler_Drain() {
	ctx := context.Background()
	s, _ := keysched.New[int](keysched.WithWorkers(4))
	defer s.Close(ctx)

	var done atomic.Int32
	for i := range 100 {
		s.Submit(ctx, i%7, func(context.Context) error { done.Add(1); return nil })
	}
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := s.Drain(waitCtx); err != nil {
		panic(err) // the context ended first: the error says how many are unfinished
	}
	st := s.Stats()
	fmt.Println(done.Load(), st.Pending, st.Keys)
	// Output: 100 0 0
}

// Done is a channel, to wait for a task together with something else.
func ExampleCompletion_Done() {
	ctx := context.Background()
	s, _ := keysched.New[string]()
	defer s.Close(ctx)

	c, _ := s.Submit(ctx, "report-1", func(context.Context) error { return nil })
	select {
	case <-c.Done():
		fmt.Println("done:", c.Err())
	case <-time.After(time.Minute):
		fmt.Println("still running")
	}
	// Output: done: <nil>
}

// A task's context keeps the values of the context given to Submit, but not
// its cancellation: a request that ends does not cancel the work it handed
// off. It is cancelled by Completion.Cancel, Close giving up, the attempt's
// end and WithTaskTimeout.
func ExampleTask() {
	ctx := context.Background()
	s, _ := keysched.New[string]()
	defer s.Close(ctx)

	type requestID struct{}
	reqCtx, endRequest := context.WithCancel(context.WithValue(ctx, requestID{}, "req-81"))
	requestOver := make(chan struct{})
	c, _ := s.Submit(reqCtx, "user-5", func(taskCtx context.Context) error {
		<-requestOver
		fmt.Println(taskCtx.Value(requestID{}), taskCtx.Err(), keysched.Attempt(taskCtx))
		return nil
	})
	endRequest() // the HTTP request that submitted the task has ended
	close(requestOver)
	c.Wait(ctx)
	// Output: req-81 <nil> 1
}

// Without a retry policy a failed task is attempted once; its error is its
// outcome, and it goes to the dead letter (or, without one, to the log).
// The key moves on.
func ExampleWithDeadLetter() {
	ctx := context.Background()
	s, _ := keysched.New[string](
		keysched.WithDeadLetter(func(dl keysched.DeadLetter[string]) {
			fmt.Printf("dead letter: key %s, %d attempt(s), %v\n", dl.Key, dl.Attempts, dl.Errors)
		}),
	)
	defer s.Close(ctx)

	failed, _ := s.Submit(ctx, "invoice-12", func(context.Context) error {
		return errors.New("template missing")
	})
	next, _ := s.Submit(ctx, "invoice-12", func(context.Context) error { return nil })
	fmt.Println(failed.Wait(ctx), next.Wait(ctx))
	// Output:
	// dead letter: key invoice-12, 1 attempt(s), [template missing]
	// template missing <nil>
}

// An error wrapped with Permanent is not retried: the task goes to the dead
// letter after the attempt that returned it.
func ExamplePermanent() {
	ctx := context.Background()
	errNotFound := errors.New("account not found")
	s, _ := keysched.New[string](
		keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Millisecond}),
		keysched.WithDeadLetter(func(dl keysched.DeadLetter[string]) {
			fmt.Println("attempts:", dl.Attempts, "not found:", errors.Is(dl.Err, errNotFound))
		}),
	)
	defer s.Close(ctx)

	c, _ := s.Submit(ctx, "acct-0", func(context.Context) error {
		return keysched.Permanent(errNotFound) // retrying cannot help
	})
	fmt.Println(c.Wait(ctx))
	// Output:
	// attempts: 1 not found: true
	// account not found
}

// A task refused locally (a bulkhead full, a breaker open, a rate limiter
// saying wait) did not really start its work: Snooze runs it again later
// without spending an attempt. Here a budget of one attempt survives three
// refusals, and the task's key keeps its order meanwhile.
func ExampleSnooze() {
	ctx := context.Background()
	s, _ := keysched.New[string](
		keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 1}), // one real attempt
		keysched.WithDeadLetter(func(dl keysched.DeadLetter[string]) { fmt.Println("dead letter:", dl.Err) }),
	)
	defer s.Close(ctx)

	slots := make(chan struct{}) // a bulkhead with no free slot yet
	refusals := 0
	c, _ := s.Submit(ctx, "partner-7", func(ctx context.Context) error {
		select {
		case <-slots:
		default:
			if refusals++; refusals == 3 {
				close(slots) // the calls in flight ended
			}
			return keysched.Snooze(errors.New("bulkhead full"), time.Millisecond)
		}
		fmt.Println("delivered on attempt", keysched.Attempt(ctx), "after", refusals, "refusals")
		return nil
	})
	next, _ := s.Submit(ctx, "partner-7", func(context.Context) error { fmt.Println("next event"); return nil })
	fmt.Println(c.Wait(ctx), next.Wait(ctx), s.Stats().Snoozed)
	// Output:
	// delivered on attempt 1 after 3 refusals
	// next event
	// <nil> <nil> 3
}

// A panicking task is recovered on its worker: the outcome is a *PanicError
// with the value and the stack, and the key goes on.
func ExamplePanicError() {
	ctx := context.Background()
	s, _ := keysched.New[string](keysched.WithDeadLetter(func(keysched.DeadLetter[string]) {}))
	defer s.Close(ctx)

	c, _ := s.Submit(ctx, "k", func(context.Context) error {
		var m map[string]int
		m["x"] = 1 //nolint:staticcheck // SA5000: the panic this example shows
		return nil
	})
	err := c.Wait(ctx)
	var pe *keysched.PanicError
	fmt.Println(errors.As(err, &pe), len(pe.Stack) > 0)
	fmt.Println(pe.Value)
	// Output:
	// true true
	// assignment to entry in nil map
}

// WithTaskTimeout gives each attempt's context a deadline; a task that
// respects its context stops there.
func ExampleWithTaskTimeout() {
	ctx := context.Background()
	s, _ := keysched.New[string](
		keysched.WithTaskTimeout(5*time.Millisecond),
		keysched.WithDeadLetter(func(keysched.DeadLetter[string]) {}),
	)
	defer s.Close(ctx)

	c, _ := s.Submit(ctx, "endpoint-3", func(ctx context.Context) error {
		<-ctx.Done() // a call that hangs, bounded by its context
		return ctx.Err()
	})
	fmt.Println(c.Wait(ctx))
	// Output: context deadline exceeded
}

// Skip gives up a parked key's failed task and moves the key on to its next
// task; Resume would run the failed task again.
func ExampleScheduler_Skip() {
	ctx := context.Background()
	parked := make(chan string, 1)
	s, _ := keysched.New[string](
		keysched.WithFailurePolicy(keysched.Park),
		keysched.WithDeadLetter(func(dl keysched.DeadLetter[string]) { parked <- dl.Key }),
	)
	defer s.Close(ctx)

	bad, _ := s.Submit(ctx, "cart-8", func(context.Context) error { return errors.New("malformed event") })
	next, _ := s.Submit(ctx, "cart-8", func(context.Context) error { return nil })
	key := <-parked // the key is parked: next waits behind bad
	fmt.Println(s.Parked(), s.Stats().ParkedKeys)

	if err := s.Skip(key); err != nil {
		panic(err)
	}
	fmt.Println(bad.Wait(ctx), next.Wait(ctx), s.Parked())
	fmt.Println(errors.Is(s.Skip(key), keysched.ErrNotParked))
	// Output:
	// [cart-8] 1
	// malformed event <nil> []
	// true
}

// Several schedulers can share one ants pool; WithMaxConcurrency is each
// one's bulkhead, so that one of them cannot take the whole pool.
func ExampleWithPool() {
	ctx := context.Background()
	pool, err := ants.NewPool(4)
	if err != nil {
		panic(err)
	}
	defer pool.ReleaseTimeout(time.Minute)

	var running, most atomic.Int32
	task := func(context.Context) error {
		n := running.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(time.Millisecond)
		running.Add(-1)
		return nil
	}
	orders, _ := keysched.New[int](keysched.WithPool(pool), keysched.WithMaxConcurrency(2))
	emails, _ := keysched.New[int](keysched.WithPool(pool), keysched.WithMaxConcurrency(2))
	for i := range 20 {
		orders.Submit(ctx, i, task)
	}
	orders.Close(ctx) // waits for its tasks; leaves the shared pool alone
	emails.Close(ctx)
	fmt.Println("at most 2 of orders' tasks at once:", most.Load() <= 2)
	fmt.Println("pool still open:", !pool.IsClosed())
	// Output:
	// at most 2 of orders' tasks at once: true
	// pool still open: true
}

// KeyDepth tells how many tasks a key holds, queued plus running: the
// quantity WithMaxKeyDepth bounds.
func ExampleScheduler_KeyDepth() {
	ctx := context.Background()
	s, _ := keysched.New[string]()
	defer s.Close(ctx)

	release := make(chan struct{})
	s.Submit(ctx, "busy", func(context.Context) error { <-release; return nil })
	s.Submit(ctx, "busy", func(context.Context) error { return nil })
	s.Submit(ctx, "busy", func(context.Context) error { return nil })
	fmt.Println(s.KeyDepth("busy"), s.KeyDepth("idle"))
	close(release)
	s.Drain(ctx)
	fmt.Println(s.KeyDepth("busy"))
	// Output:
	// 3 0
	// 0
}

// Resume runs a parked key's failed task again with a fresh attempt budget;
// the key's later tasks follow once it succeeds.
func ExampleScheduler_Resume() {
	ctx := context.Background()
	parked := make(chan keysched.DeadLetter[string], 1)
	s, _ := keysched.New[string](
		keysched.WithRetry(keysched.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond}),
		keysched.WithFailurePolicy(keysched.Park),
		keysched.WithDeadLetter(func(dl keysched.DeadLetter[string]) { parked <- dl }),
	)
	defer s.Close(ctx)

	var healthy atomic.Bool
	c, _ := s.Submit(ctx, "account-9", func(ctx context.Context) error {
		fmt.Println("attempt", keysched.Attempt(ctx))
		if !healthy.Load() {
			return errors.New("bank unreachable")
		}
		return nil
	})
	dl := <-parked
	fmt.Println("parked after", dl.Attempts, "attempts:", s.Parked())

	healthy.Store(true)
	if err := s.Resume("account-9"); err != nil {
		panic(err)
	}
	fmt.Println(c.Wait(ctx), s.Parked())
	// Output:
	// attempt 1
	// attempt 2
	// parked after 2 attempts: [account-9]
	// attempt 3
	// <nil> []
}

// SubmitBatch accepts what arrives in batches (a fetch from a log, say) as
// that many Submits would, for less; each key keeps the batch's order.
func ExampleScheduler_SubmitBatch() {
	ctx := context.Background()
	s, _ := keysched.New[string]()
	defer s.Close(ctx)

	var mu sync.Mutex
	seen := map[string][]int{}
	record := func(key string, offset int) keysched.BatchItem[string] {
		return keysched.BatchItem[string]{Key: key, Task: func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			seen[key] = append(seen[key], offset)
			return nil
		}}
	}
	batch := []keysched.BatchItem[string]{
		record("acct-1", 100), record("acct-2", 101), record("acct-1", 102), record("acct-1", 103),
	}
	completions, err := s.SubmitBatch(ctx, batch)
	if err != nil {
		// The first len(completions) tasks were accepted and will run;
		// resubmit batch[len(completions):] to go on in order.
		panic(err)
	}
	for _, c := range completions {
		c.Wait(ctx)
	}
	fmt.Println(len(completions), seen["acct-1"], seen["acct-2"])
	// Output: 4 [100 102 103] [101]
}

// TrySubmitBatch accepts the longest prefix that fits and says why the rest
// did not: resubmit items[len(cs):] later to go on in order.
func ExampleScheduler_TrySubmitBatch() {
	ctx := context.Background()
	s, err := keysched.New[int](keysched.WithMaxKeyDepth(2))
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)

	gate := make(chan struct{})
	wait := func(context.Context) error { <-gate; return nil }
	items := []keysched.BatchItem[int]{{Key: 1, Task: wait}, {Key: 1, Task: wait}, {Key: 1, Task: wait}, {Key: 2, Task: wait}}
	cs, err := s.TrySubmitBatch(ctx, items)
	fmt.Println(len(cs), errors.Is(err, keysched.ErrKeyFull))
	close(gate)
	rest, err := s.SubmitBatch(ctx, items[len(cs):])
	fmt.Println(len(rest), err)
	// Output:
	// 2 true
	// 2 <nil>
}

// An Observer times every task: the queue wait (acceptance to first start)
// and each attempt's duration. Here it keeps the slowest attempt; a metrics
// package records histograms instead (see otelkeysched).
func ExampleObserver() {
	ctx := context.Background()
	var mu sync.Mutex
	var slowest time.Duration
	var attempts int
	s, err := keysched.New[string](keysched.WithObserver(keysched.Observer[string]{
		AttemptEnded: func(key string, a keysched.AttemptInfo) {
			mu.Lock() // quick, never blocks for long: this runs on the worker
			defer mu.Unlock()
			attempts++
			slowest = max(slowest, a.Ended.Sub(a.Started))
		},
	}))
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)
	for _, d := range []time.Duration{time.Millisecond, 20 * time.Millisecond} {
		s.Submit(ctx, "acct-1", func(context.Context) error { time.Sleep(d); return nil })
	}
	s.Drain(ctx)
	mu.Lock()
	defer mu.Unlock()
	fmt.Println(attempts, slowest >= 20*time.Millisecond)
	// Output: 2 true
}

// Keys lists the keys holding the most tasks, with their depth, whether they
// are parked, and how long their oldest task has waited (WithTaskAges):
// per-key detail for a debug endpoint, where metrics must not carry keys.
func ExampleScheduler_Keys_parked() {
	ctx := context.Background()
	parked := make(chan string, 1)
	s, _ := keysched.New[string](keysched.WithTaskAges(), keysched.WithFailurePolicy(keysched.Park),
		keysched.WithDeadLetter(func(dl keysched.DeadLetter[string]) { parked <- dl.Key })) // called once the key is parked
	release := make(chan struct{})
	for range 3 {
		s.Submit(ctx, "acct-busy", func(context.Context) error { <-release; return nil })
	}
	s.Submit(ctx, "acct-poison", func(context.Context) error { return errors.New("bad event") })
	s.Submit(ctx, "acct-poison", func(context.Context) error { return nil })
	<-parked
	for _, k := range s.Keys(10) {
		fmt.Printf("%s depth=%d parked=%t waited=%t\n", k.Key, k.Depth, k.Parked, k.HeadAge > 0)
	}
	poisonAge := s.KeyAge("acct-poison") // read first: ages grow while we read
	fmt.Println(s.OldestAge() >= poisonAge)
	close(release)
	s.Skip("acct-poison")
	s.Close(ctx)
	// Output:
	// acct-busy depth=3 parked=false waited=true
	// acct-poison depth=2 parked=true waited=true
	// true
}
