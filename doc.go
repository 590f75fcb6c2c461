// Package keysched runs tasks in order per key, concurrently across keys, on
// one bounded pool of workers.
//
// The guarantee: for two tasks accepted for one key in that order, the first
// one's run (every attempt of it, if it is retried) happens before the second
// one's run begins; nothing is promised between different keys. Every
// accepted task ends in exactly one terminal outcome (succeeded, failed,
// panicked, cancelled or aborted), reported by its [Completion] and counted
// in [Stats]: no accepted task is silently lost.
//
// Keys are account ids, order ids, user ids, file paths: any comparable
// type, millions possible, thousands live, unknown up front. A key whose task
// is slow, stuck or failing holds one worker and delays only its own later
// tasks; the other keys go on (no head-of-line blocking of unrelated keys).
//
// # A complete program
//
//	package main
//
//	import (
//		"context"
//		"fmt"
//		"log"
//
//		"github.com/keysched/keysched"
//	)
//
//	func main() {
//		ctx := context.Background()
//		s, err := keysched.New[string](keysched.WithWorkers(16))
//		if err != nil {
//			log.Fatal(err) // a bad option: errors.Is(err, keysched.ErrInvalidOption)
//		}
//		defer s.Close(ctx)
//
//		for i, account := range []string{"alice", "bob", "alice", "carol", "alice"} {
//			_, err := s.Submit(ctx, account, func(ctx context.Context) error {
//				fmt.Println(account, "event", i) // alice: 0, then 2, then 4
//				return nil
//			})
//			if err != nil {
//				log.Fatal(err) // not accepted: nothing will run
//			}
//		}
//		if err := s.Drain(ctx); err != nil { // wait for everything accepted so far
//			log.Fatal(err)
//		}
//		fmt.Println(s.Stats().Succeeded, "events applied")
//	}
//
// The lines of alice come out in the order 0, 2, 4; those of bob and carol
// may come before, between or after them.
//
// # The life of a task
//
// Accepted. [Scheduler.Submit] checks its arguments (a nil context or task,
// or a key that cannot be a map key, is refused with an error and nothing is
// enqueued), takes one of the scheduler's pending slots ([WithMaxPending]),
// and appends the task to its key's chain inside one atomic operation on
// that key of a concurrent map, provided the key has room ([WithMaxKeyDepth]).
// At either bound Submit waits for room and [Scheduler.TrySubmit] fails (see
// Bounds). [Scheduler.SubmitBatch] accepts many tasks as that many Submits
// would, for less. Once Submit returns a *Completion, the task will reach
// exactly one outcome. Acceptance is decided atomically with [Scheduler.Close]: a task is
// either accepted, and then run or aborted, or refused with [ErrClosed].
//
// Queued behind its key. A task whose key had no chain is its key's head: it
// goes to the ready queue at once, and a runner is started for it if fewer
// than the worker bound are running. Any other task is a node in its key's
// chain, under 100 bytes: no goroutine, no worker, no timer. Nobody waits
// for a predecessor; whoever finishes a task hands its key on.
//
// Run. A runner is one function on one worker of the ants pool. It takes the
// ready queue's oldest head and runs it with the task's context (it keeps the
// values of Submit's context but not its cancellation or deadline; see
// [Task]). When the task returns, the same worker runs the key's next task
// itself, in a loop, up to 32 tasks of the key in a row, then puts the key at
// the back of the ready queue so that one busy key cannot monopolise a
// worker. A panic is recovered on the worker and becomes the task's outcome
// as a [*PanicError]; the worker lives on. The worker that finishes a key's
// last task removes the key from the map, in the same atomic operation that
// confirms no task was appended meanwhile, so one-shot keys leave nothing
// behind.
//
// Retried. By default a task is attempted once (at-most-once execution). With
// [WithRetry] a failed attempt is retried, up to RetryPolicy.MaxAttempts in
// all, after a delay drawn with exponential backoff and full jitter. While it
// waits, the task holds its key (its later tasks wait: order holds) but no
// worker and no goroutine: a timer puts it back in the ready queue.
// [Attempt] tells a task which attempt it is. Never retried: errors wrapped
// with [Permanent], panics (unless [WithRetryPanics]), and attempts whose
// context was cancelled by [Completion.Cancel] or Close. Not attempts at
// all: runs that return an error wrapped with [Snooze] (the task was refused
// locally and did not start its work): they run again after the given delay
// without spending the budget.
//
// Finished or dead-lettered. A task that returns nil has succeeded. One that
// failed for good (its error with no retry policy, its attempts used up, a
// Permanent error, a panic, an error after Cancel) is handed to the [WithDeadLetter] function with
// its key, its attempts' errors and the task itself, or logged with log/slog
// when there is none, and its Completion reports the last error. Under the
// [Park] failure policy its key stops there, with the failed task at its
// head, until [Scheduler.Resume] runs it again or [Scheduler.Skip] gives it
// up. A task withdrawn by Cancel before it ran ends with context.Canceled;
// one that Close gave up on before it ran ends with [ErrAborted] and is
// dead-lettered too. Then its key moves on. A task's outcome is counted in
// Stats before its Completion is done, and its Completion is done only once
// its dead letter, if it has one, was delivered: code that acknowledges an
// event (commits an offset) when its Completion is done can rely on both.
//
// # Bounds, and what happens at each
//
// Workers: at most [WithWorkers] tasks run at once (default [DefaultWorkers],
// on the scheduler's own ants pool), or the size of a pool given with
// [WithPool], lowered by [WithMaxConcurrency] (a bulkhead for schedulers that
// share a pool). Ready tasks beyond the bound wait in the ready queue, in
// order of readiness, costing memory only. A task stuck forever holds its
// worker forever: bound handlers with [WithTaskTimeout] and their own
// contexts.
//
// Depth per key: at most [WithMaxKeyDepth] queued plus running tasks per key
// (default [DefaultMaxKeyDepth]). A key at its bound makes Submit wait until
// one of its tasks finishes or Submit's context ends (then the error wraps
// [ErrKeyFull] and the context's error), and TrySubmit fail with ErrKeyFull.
// Only that key's submitters wait: backpressure on the hot key alone.
//
// Pending in total: at most [WithMaxPending] accepted, unfinished tasks over
// all keys (default [DefaultMaxPending], near 7 MiB of queued tasks). At the
// bound Submit waits, TrySubmit fails with [ErrFull]. This is the memory
// bound.
//
// From inside a task: a Submit made with the task's context (or one derived
// from it) never waits, at either bound; it fails at once with ErrKeyFull or ErrFull, since a task
// waiting for room on its own key, or every worker waiting for room, is a
// deadlock. [Scheduler.Drain] and Close made with a task's context return
// [ErrInsideTask]. [Completion.Wait] made with a task's context returns
// [ErrDeadlock] when the wait could never end: on the task itself, on a later
// task of its own key, or closing a cycle of such waits across keys. The
// scheduler knows a task only by its context (Go has no goroutine identity):
// made from a task with another context, such a Close or Wait blocks for
// ever, without an error (a Close still waiting after [CloseWaitWarning]
// logs a warning).
//
// Time: [WithTaskTimeout] puts a deadline on each attempt's context; a
// timed-out attempt that returns an error is a failed, retryable attempt.
// RetryPolicy.MaxBackoff caps each retry delay (default the larger of
// InitialBackoff and one minute). Close's context bounds shutdown: when it
// ends, running tasks' contexts are cancelled, every task that has not
// started is aborted and dead-lettered, and Close returns within
// [CloseGrace] with a [*CloseError] saying what did not run and what was
// still running or being delivered (that goes on in the background;
// nothing is dropped; Drain after such a Close waits for it, so call it
// before the process exits).
//
// # What each call costs
//
// Submit: for a task behind others of its key, one allocation of at most 96
// bytes, its node, which is also its Completion; for a task that starts its
// key's chain, two: its node with the chain header, and the map's entry for
// the key (TestSubmitAllocations holds both). One atomic compute on the key
// in the map; for a key's head, a ready-queue push
// and perhaps a runner started through ants. A queued task has no goroutine,
// and Submit never waits for a worker: it waits only at a bound, and only
// until its context ends.
//
// SubmitBatch: one admission against the pending bound for the whole batch,
// one allocation for all its tasks' nodes, and consecutive items of one key
// appended to its chain in one map operation. The accepted tasks are always a
// prefix of the batch; the error says why the next one was refused.
//
// Completion: [Completion.Err] is two atomic loads. [Completion.Done], and
// [Completion.Wait] on a task not yet done, make the task's done channel on
// their first call, never before: a task nobody waits on has none.
// [Completion.Cancel] does not wait for a running task to stop.
//
// [Scheduler.Stats] and [Scheduler.KeyDepth] read counters and the map and
// take no lock that a succeeding task's path takes. Drain, and Close until
// its context ends, sleep on a channel that the completion bringing the
// pending count to zero closes; they do not poll.
//
// # Watching it
//
// [Scheduler.Stats] counts every outcome; [Scheduler.KeyDepth] and
// [Scheduler.Parked] answer for one key or the parked ones. With
// [WithTaskAges] (one monotonic clock read per accepted task),
// [Scheduler.OldestAge], [Scheduler.KeyAge] and [Scheduler.Keys] tell how long
// the oldest unfinished tasks have waited and which keys hold the most: for
// a metrics collection or a debug endpoint, not per task (Keys and OldestAge
// walk every live key). [WithObserver] calls your functions when a task is
// accepted, when each attempt starts and ends, and when a task is
// dead-lettered, for latency histograms; a scheduler without one pays a nil
// check per event. Never make a key a metric attribute: keys are unbounded
// and often personal data. The otelkeysched module of this repository
// exports all of it as OpenTelemetry metrics.
//
// # Where each mechanism lives
//
//   - doc.go: this overview.
//   - chain.go: the public face. [Scheduler], [New], Submit, TrySubmit;
//     the task node.
//   - batch.go: SubmitBatch and TrySubmitBatch.
//   - tailmap.go: the concurrent map (xsync Map) from each live key to its
//     chain's header, which holds the tail. Appending a task and removing a drained key each happen
//     inside one Compute on that key; invalid keys are refused before they
//     reach it.
//   - close.go: shutdown. Drain, Close, and what Close does once it gives
//     up: abort what has not started, deliver those dead letters
//     (concurrently across keys, in order within a key, one lane per key),
//     return within CloseGrace with a [CloseError].
//   - stats.go: [Stats].
//   - depth.go: the bounds. KeyDepth, the per-key depth, the pending count (with the
//     closed flag in the same word, so "closed?" and "take a slot" are one
//     CompareAndSwap), and the waiting protocol that loses no wake-up.
//   - pool.go: the workers. The ants pool (own or shared), the ready queue of
//     runnable heads, starting and retiring runners.
//   - run.go: running tasks. The runner loop and its per-key budget, one
//     attempt, what follows a failure, handing a key on to its next task.
//   - retry.go: delivery semantics. [RetryPolicy] and its full-jitter delays,
//     [DeadLetter], [FailurePolicy], Park, Resume and Skip.
//   - completion.go: the [Completion] handle, the task states and their
//     transitions, Cancel, the lazily made channels.
//   - deadlock.go: finding waits that can never end ([ErrDeadlock]).
//   - taskctx.go: the task's context (values kept, cancellation its own),
//     recognising a task's context, [Attempt].
//   - observe.go: [Observer] and WithObserver, task ages (WithTaskAges,
//     OldestAge, KeyAge), the per-key inspection Keys.
//   - counter.go and pad.go: striped counters and cache-line padding, so
//     that submitters and workers on different cores do not share lines.
//   - options.go and errors.go: options and their defaults; sentinel errors,
//     [PanicError], [Permanent]; retry.go: [Snooze] too.
//
// # When to use something else
//
// You need no order at all: a plain pool (ants, or errgroup.Group.SetLimit)
// is simpler. It is not cheaper per task: submitting each task to an ants
// pool measured 1.8 times keysched's time on no-op tasks (README.md, "When
// not to use it"; the figures, their command and date are in
// docs/performance.md, "What isolation buys: keybench").
//
// Your handlers are tiny and uniform and no key is ever slow: striped lanes
// (hash the key onto one of N goroutines, each with its own queue) cost a
// fraction of keysched's time per task (a fifth to a third on a
// no-op handler, measured in the repository's docs/performance.md). They
// pay for it with head-of-line blocking: one slow key stalls every key that
// hashes onto its lane.
//
// A goroutine per key gives order and isolation but neither a worker bound
// nor a memory bound: one goroutine per live key.
//
// You need durability, exactly-once side effects, or one order across keys:
// keysched holds tasks in memory and promises none of these. Put a log in
// front (Kafka, a database outbox) and acknowledge an event only when its
// Completion reports success; the kafka module of this repository does that
// for a franz-go group consumer, with key-level parallelism inside each
// partition, and its db module gives a transactional outbox and an idempotent
// inbox (exactly-once effects on a database, over at-least-once delivery).
//
// You want typed publish/subscribe with several subscribers per event, each
// with its own order, bounds and dead letters: package
// github.com/keysched/keysched/bus builds that on this scheduler.
package keysched
