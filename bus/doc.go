// Package bus is an in-process, typed publish/subscribe event bus built on
// the keysched scheduler.
//
// The guarantee: for each subscriber, two events of one key that it accepted
// in that order are handled in that order, the first one's handling (every
// attempt of it) happening before the second one's begins; different keys,
// and different subscribers, run concurrently. Every event a subscriber
// accepted is handled or dead-lettered with its envelope, every event one
// refused is named in Publish's error, and those an ejected subscriber skips
// are counted: nothing is dropped silently.
//
// At a glance, use it if you want:
//
//   - publishers that call Publish(ctx, key, event) and subscribers that
//     register a typed handler, func(ctx, Envelope[K], E) error, for a
//     concrete event type or an interface;
//   - order per (key, subscriber), concurrency across keys and subscribers;
//   - one fixed, bounded set of workers (an ants pool) shared by every
//     subscriber, and bounded memory (per key and per subscriber);
//   - a slow or failing subscriber that never silently stops the bus for the
//     others: bulkheads (MaxConcurrency), per-subscriber overflow policies,
//     timeouts, ejection, retries, parking, and dead letters that carry the
//     envelope.
//
// It is not a message broker: events live in memory, nothing is persisted,
// nothing crosses a process, and a process exit loses whatever was queued.
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
//		"github.com/keysched/keysched/bus"
//	)
//
//	type OrderPlaced struct {
//		Order string
//		Total int
//	}
//
//	func main() {
//		ctx := context.Background()
//		b, err := bus.New[string](bus.WithWorkers(16)) // keys: customer ids
//		if err != nil {
//			log.Fatal(err)
//		}
//		_, err = bus.Subscribe(b, "mailer",
//			func(ctx context.Context, env bus.Envelope[string], e OrderPlaced) error {
//				fmt.Println("mail", env.Key, "about", e.Order) // o-1, then o-2
//				return nil
//			})
//		if err != nil {
//			log.Fatal(err)
//		}
//		for _, order := range []string{"o-1", "o-2"} {
//			if err := b.Publish(ctx, "alice", OrderPlaced{Order: order, Total: 10}); err != nil {
//				log.Fatal(err) // a *bus.PublishError names the subscribers that refused
//			}
//		}
//		if err := b.Close(ctx); err != nil { // drains every subscriber
//			log.Fatal(err)
//		}
//	}
//
// # The life of an event
//
// Published. [Bus.Publish] (or [Bus.PublishEnvelope], with an ID, headers
// and a time of your own) checks its arguments, gives the envelope a UUIDv7
// ID and the time when they are empty, and routes the event by its dynamic
// type: a subscriber for type E matches every event e for which e.(E) holds
// (E may be an interface the event implements). The answer is cached per
// dynamic type. An event no subscriber matches is counted in [Stats] and is
// not an error, except to [Bus.PublishEnvelopeStrict] ([ErrNoSubscriber]),
// for a publisher that must not drop an event nobody received (the outbox's
// BusSink).
//
// Offered. Publish offers the event to each matching subscriber, in the
// order of their names; each one has its own keysched.Scheduler (its own
// chains, bounds and counters) on the bus's shared pool. A subscriber with
// room accepts it; a subscriber at a bound applies its [OverflowPolicy]
// (see Bounds). The non-waiting offers are made first, so while Publish
// waits for a full Block subscriber the others already have the event.
//
// Queued behind its key, for each subscriber. An accepted event waits behind
// the earlier events of its key for that subscriber only: memory, no
// goroutine. A subscriber stuck on a key delays only its own later events of
// that key; other keys, and other subscribers of the same key, go on.
//
// Handled. A worker of the bus's pool runs the subscriber's [Handler] with
// the envelope and the event as an E. A nil error acknowledges the event.
// With [Retry] a failed attempt is retried with exponential backoff and full
// jitter, holding the key (order) but no worker; errors wrapped with
// keysched.Permanent and panics are not retried. An error wrapped with
// keysched.Snooze runs the event again after its delay without spending an
// attempt (SubStats.Snoozed counts it).
//
// Delivered or dead-lettered. An event that failed for good goes to the
// subscriber's [DeadLetters] function as a [DeadLetter] carrying the
// original envelope (ID, key, headers, payload), ready for a deliberate
// replay, or is logged with log/slog when there is none. With
// Failure(keysched.Park) the key then stops for that subscriber until
// [Subscription.Resume] (handle the event again) or [Subscription.Skip]
// (give it up). A subscriber ejected by [EjectAfter] dead-letters its queued
// events with [ErrEjected] without running them.
//
// # Bounds, and what happens at each
//
// Workers: at most [WithWorkers] handlers run at once over the whole bus
// (default [DefaultWorkers]), or the size of a pool given with [WithPool].
// [MaxConcurrency] is a subscriber's bulkhead: at most n of its handlers run
// at once, so a slow subscriber cannot take every worker.
//
// Per key and per subscriber: [MaxKeyDepth] events of one key queued plus
// running (default keysched.DefaultMaxKeyDepth), and [MaxPending] events in
// all (default keysched.DefaultMaxPending). At either bound the subscriber's
// [OnFull] policy decides: [Block] (the default) makes Publish wait for room
// until its context ends, [Reject] refuses the event for that subscriber,
// [DropNewest] drops it and counts it in [SubStats].Dropped. Every refusal
// is named, with its reason, in the [*PublishError] Publish returns; the
// subscribers that accepted the event keep it.
//
// Time: [Timeout] puts a deadline on each handler attempt's context;
// [EjectAfter] ejects a subscriber after n consecutive timed-out attempts,
// for good, logging it, while the others carry on.
//
// From inside a handler: a Publish made with the handler's context (or one
// derived from it) never waits: a full Block subscriber refuses at once,
// since waiting on the workers one is running on can deadlock. Drain, Close
// and Unsubscribe made with it return keysched.ErrInsideTask.
//
// # Delivery semantics
//
// At-most-once per subscriber by default: the handler runs once per event,
// and its error is dead-lettered. With Retry, at-least-once: a handler can
// run more than once for an event, so make it idempotent, for instance with
// [Dedup], which skips IDs it handled successfully.
//
// # Shutdown
//
// [Bus.Close] refuses new publishes with [ErrClosed], drains every
// subscriber, and releases the bus's own pool (not one given with WithPool).
// If its context ends first, events that did not run are dead-lettered with
// keysched.ErrAborted, and Close returns within keysched.CloseGrace with an
// error that says how many, per subscriber (each one's *keysched.CloseError);
// dead letters not yet delivered then are delivered in the background.
// [Subscription.Unsubscribe] does the same for one subscriber. [Bus.Drain]
// after such a Close (or Unsubscribe), and a later Close, wait for that
// background work: a process about to exit should call Drain with a deadline
// of its own, or the dead letters still being delivered are lost with it.
//
// # What it costs
//
// Per event and matching subscriber, Publish adds to the scheduler's own cost
// (one node and one map entry per accepted event) one closure holding the
// subscriber's copy of the envelope. Per event, generating the ID takes two
// allocations (the UUIDv7 and its string); pass your own ID with
// PublishEnvelope to save them. The type routing is a cached map lookup per
// dynamic type. In BenchmarkPublish (bench_test.go), one subscriber on the
// bare scheduler's workload, that makes 6 allocations (311 bytes) per event
// through the bus, the boxing of the event into an any included, against 2
// through Submit; times, with the command and date, are in the repository's
// docs/performance.md.
//
// # Watching it
//
// [Bus.Stats] counts published and unmatched events; [Subscription.Stats]
// gives a subscriber's [SubStats]: its scheduler's counters (accepted,
// succeeded, failed, dead-lettered, pending, parked keys) plus the bus's own
// (delivered, dropped, skipped, ejected). With [TaskAges],
// [Subscription.OldestAge] and [Subscription.Keys] tell how long the oldest
// unhandled events have waited and which keys hold the most; [Observe] puts
// a keysched.Observer on the subscriber's scheduler, for latency
// histograms. The otelkeysched module of this repository exports all of it
// as OpenTelemetry metrics (RegisterBus, RegisterSubscription), read at
// collection time.
//
// # Where each mechanism lives
//
//   - bus.go: the Bus, its options, Envelope, routing by type, Publish and
//     PublishEnvelope, Drain, Close, the bus's Stats.
//   - subscribe.go: Handler and Subscribe, which makes a subscriber and its
//     scheduler on the bus's pool.
//   - suboptions.go: the subscriber options and the overflow policies.
//   - subscription.go: the Subscription handle: Unsubscribe, Drain, Parked,
//     Resume, Skip.
//   - deliver.go: the per-event path, offering an event to a subscriber and
//     running its handler.
//   - deadletter.go: DeadLetter, and how a scheduler's dead letter gets back
//     to its envelope.
//   - eject.go: counting timed-out attempts, ejection, releasing an ejected
//     subscriber's parked keys.
//   - stats.go: SubStats.
//   - observe.go: Observe, TaskAges, OldestAge and Keys per subscriber.
//   - dedup.go: Dedup, an idempotent-consumer wrapper.
//
// # When to use something else
//
// One handler per key and no fan-out: the keysched scheduler itself, one
// Submit per event, costs less per event (no envelope, no routing).
//
// Durability, several processes, replay from a position: a broker (Kafka and
// the like) or a database outbox; this bus can run the handlers behind one.
//
// No order at all: a plain pool, or a channel per consumer.
package bus
