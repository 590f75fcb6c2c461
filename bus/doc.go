// Package bus is an in-process, typed publish/subscribe event bus built on
// the keysched scheduler.
//
// At a glance, use it if you want:
//
//   - publishers that call Publish(ctx, key, event) and subscribers that
//     register a typed handler, func(ctx, Envelope[K], E) error;
//   - events of one key reaching each subscriber in publication order, one at
//     a time, while different keys run concurrently;
//   - one fixed, bounded set of workers (an ants pool) shared by every
//     subscriber, and bounded memory (per key and per subscriber);
//   - a slow or failing subscriber that never silently stops the bus for the
//     others: bulkheads (MaxConcurrency), per-subscriber overflow policies,
//     timeouts, ejection, retries and dead letters that carry the envelope.
//
// It is not a message broker: events live in memory, nothing is persisted,
// and a process exit loses whatever was queued.
//
// # Routing and order
//
// A subscriber for type E receives every published event e for which the
// type assertion e.(E) holds: E may be a concrete type or an interface the
// event implements. An event no subscriber matches is counted (Stats) and is
// not an error. Each subscriber has its own keysched.Scheduler (its own
// chains, bounds and counters) on the bus's shared pool, so the order
// promise is per (key, subscriber): for two events of one key accepted by a
// subscriber in that order, the handler's run on the first (every attempt of
// it) happens before its run on the second begins. A subscriber stuck on a
// key delays only its own later events of that key: other keys, and other
// subscribers of the same key, go on.
//
// # Delivery
//
// Delivery is at-most-once per subscriber by default: the handler runs once
// per event and its error is reported (dead-lettered), then the key moves on.
// With Retry it is at-least-once: bounded attempts with exponential backoff
// and full jitter, then dead-lettered. A handler can then run more than once
// for an event: make it idempotent, for instance with Dedup.
//
// Publish fans an event out to every matching subscriber. A subscriber at
// one of its bounds (MaxKeyDepth, MaxPending) applies its OverflowPolicy:
// Block waits for room (bounded by Publish's context), Reject refuses, and
// DropNewest drops the event and counts it. Every refusal is reported in the
// *PublishError that Publish returns; the subscribers that accepted the
// event keep it. No drop is silent.
//
// # Handlers
//
// A handler runs on a worker of the bus's pool, with the context keysched
// gave its attempt: it carries the values of Publish's context, is cancelled
// when the attempt ends, and has a deadline with Timeout. A handler may
// publish with that context (or one derived from it): such a Publish never
// waits for room, it fails fast with a *PublishError instead, since waiting
// on the workers one is running on can deadlock. Drain, Close and
// Unsubscribe called with it return keysched.ErrInsideTask.
//
// # Shutdown
//
// Close refuses new publishes with ErrClosed, drains every subscriber, and
// releases the bus's own pool (not one given with WithPool). If its context
// ends first, events that did not run are dead-lettered with
// keysched.ErrAborted and Close's error says how many, per subscriber.
package bus
