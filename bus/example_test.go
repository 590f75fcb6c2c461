package bus_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/bus"
)

type OrderPlaced struct {
	Order string
	Total int
}

type OrderShipped struct{ Order string }

// OrderEvent is implemented by every order event: a subscriber for it gets
// them all.
type OrderEvent interface{ OrderID() string }

func (e OrderPlaced) OrderID() string  { return e.Order }
func (e OrderShipped) OrderID() string { return e.Order }

// Publish events keyed by customer: each subscriber gets one customer's
// events in publication order, and customers run concurrently.
func Example() {
	ctx := context.Background()
	b, err := bus.New[string](bus.WithWorkers(4))
	if err != nil {
		panic(err)
	}
	// A subscriber for one concrete type.
	_, err = bus.Subscribe(b, "mailer", func(ctx context.Context, env bus.Envelope[string], e OrderPlaced) error {
		fmt.Printf("mail %s: order %s placed, total %d\n", env.Key, e.Order, e.Total)
		return nil
	})
	if err != nil {
		panic(err)
	}
	// A subscriber for an interface: every order event.
	var audited atomic.Int32
	_, err = bus.Subscribe(b, "audit", func(ctx context.Context, env bus.Envelope[string], e OrderEvent) error {
		audited.Add(1)
		return nil
	}, bus.MaxConcurrency(1))
	if err != nil {
		panic(err)
	}

	for _, ev := range []any{
		OrderPlaced{Order: "o-1", Total: 30},
		OrderShipped{Order: "o-1"},
		OrderPlaced{Order: "o-2", Total: 12},
	} {
		if err := b.Publish(ctx, "alice", ev); err != nil {
			panic(err)
		}
	}
	if err := b.Close(ctx); err != nil { // drains every subscriber
		panic(err)
	}
	fmt.Println("audited:", audited.Load())
	fmt.Println(errors.Is(b.Publish(ctx, "alice", OrderShipped{Order: "o-2"}), bus.ErrClosed))
	// Output:
	// mail alice: order o-1 placed, total 30
	// mail alice: order o-2 placed, total 12
	// audited: 3
	// true
}

// An event that fails for good reaches the subscriber's dead letters with
// its envelope: ID, headers and payload, ready for a deliberate replay.
func Example_deadLetters() {
	ctx := context.Background()
	b, err := bus.New[string](bus.WithWorkers(2), bus.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		panic(err)
	}
	errDeclined := errors.New("card declined")
	_, err = bus.Subscribe(b, "billing",
		func(ctx context.Context, env bus.Envelope[string], e OrderPlaced) error {
			if keysched.Attempt(ctx) < 3 {
				return fmt.Errorf("gateway unavailable (attempt %d)", keysched.Attempt(ctx))
			}
			return keysched.Permanent(errDeclined) // no more retries
		},
		bus.Retry(keysched.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Millisecond}),
		bus.DeadLetters(func(dl bus.DeadLetter[string]) {
			fmt.Printf("dead letter from %s: event %s for %s, correlation %s, payload %+v\n",
				dl.Subscriber, dl.Envelope.ID, dl.Envelope.Key, dl.Envelope.Headers["correlation-id"], dl.Envelope.Event)
			fmt.Printf("after %d attempts: %v (declined: %t)\n", dl.Attempts, dl.Err, errors.Is(dl.Err, errDeclined))
		}))
	if err != nil {
		panic(err)
	}
	err = b.PublishEnvelope(ctx, bus.Envelope[string]{
		ID:      "evt-42",
		Key:     "bob",
		Event:   OrderPlaced{Order: "o-9", Total: 99},
		Headers: map[string]string{"correlation-id": "req-7"},
	})
	if err != nil {
		panic(err)
	}
	if err := b.Close(ctx); err != nil {
		panic(err)
	}
	// Output:
	// dead letter from billing: event evt-42 for bob, correlation req-7, payload {Order:o-9 Total:99}
	// after 3 attempts: card declined (declined: true)
}

// A subscriber that may fall behind can refuse instead of holding up the
// publisher: Publish then names it, and the other subscribers have the
// event.
func ExamplePublishError() {
	ctx := context.Background()
	b, err := bus.New[string](bus.WithWorkers(2))
	if err != nil {
		panic(err)
	}
	hold := make(chan struct{})
	running := make(chan struct{})
	_, err = bus.Subscribe(b, "slow", func(ctx context.Context, env bus.Envelope[string], e OrderPlaced) error {
		running <- struct{}{}
		<-hold
		return nil
	}, bus.MaxKeyDepth(1), bus.OnFull(bus.DropNewest))
	if err != nil {
		panic(err)
	}
	_, err = bus.Subscribe(b, "fast", func(ctx context.Context, env bus.Envelope[string], e OrderPlaced) error {
		return nil
	})
	if err != nil {
		panic(err)
	}
	_ = b.Publish(ctx, "carol", OrderPlaced{Order: "o-1"})
	<-running // "slow" holds its one slot for carol
	err = b.Publish(ctx, "carol", OrderPlaced{Order: "o-2"})
	var pe *bus.PublishError
	if errors.As(err, &pe) {
		for name, why := range pe.Refused {
			fmt.Printf("%s refused: dropped=%t key full=%t\n", name,
				errors.Is(why, bus.ErrDropped), errors.Is(why, keysched.ErrKeyFull))
		}
	}
	close(hold)
	if err := b.Close(ctx); err != nil {
		panic(err)
	}
	// Output:
	// slow refused: dropped=true key full=true
}

// Subscribe registers a typed handler with its own bounds and failure
// handling; its Subscription names it, counts its events, and removes it.
func ExampleSubscribe() {
	ctx := context.Background()
	b, err := bus.New[string](bus.WithWorkers(4))
	if err != nil {
		panic(err)
	}
	defer b.Close(ctx)

	sub, err := bus.Subscribe(b, "ledger",
		func(ctx context.Context, env bus.Envelope[string], e OrderPlaced) error {
			return nil // apply e to env.Key's ledger
		},
		bus.MaxConcurrency(2),      // at most 2 of the bus's workers
		bus.MaxKeyDepth(100),       // events per customer, queued + running
		bus.OnFull(bus.Reject),     // refuse rather than hold up the publisher
		bus.Timeout(5*time.Second), // each attempt's deadline
		bus.Retry(keysched.RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond}),
	)
	if err != nil {
		panic(err)
	}
	for i := range 5 {
		if err := b.Publish(ctx, "dave", OrderPlaced{Order: fmt.Sprint("o-", i)}); err != nil {
			panic(err)
		}
	}
	if err := sub.Drain(ctx); err != nil {
		panic(err)
	}
	st := sub.Stats()
	fmt.Println(sub.Name(), st.Submitted, st.Delivered)
	fmt.Println(sub.Unsubscribe(ctx), b.Subscriptions())

	_, err = bus.Subscribe(b, "bad", func(context.Context, bus.Envelope[string], OrderPlaced) error { return nil },
		bus.EjectAfter(3)) // EjectAfter counts timed-out attempts: it needs Timeout
	fmt.Println(errors.Is(err, keysched.ErrInvalidOption))
	// Output:
	// ledger 5 5
	// <nil> []
	// true
}

// Publish routes an event by its dynamic type. An event that no subscriber
// wants is counted, and is not an error.
func ExampleBus_Publish() {
	ctx := context.Background()
	b, _ := bus.New[string](bus.WithWorkers(2))
	defer b.Close(ctx)

	got := make(chan string, 1)
	bus.Subscribe(b, "shipping", func(ctx context.Context, env bus.Envelope[string], e OrderShipped) error {
		got <- fmt.Sprint("shipped: ", e.Order, ", id set: ", env.ID != "")
		return nil
	})
	fmt.Println(b.Publish(ctx, "erin", OrderShipped{Order: "o-4"}))
	fmt.Println(b.Publish(ctx, "erin", OrderPlaced{Order: "o-5"})) // nobody subscribes to OrderPlaced
	fmt.Println(<-got)
	st := b.Stats()
	fmt.Println(st.Published, st.Unmatched)
	// Output:
	// <nil>
	// <nil>
	// shipped: o-4, id set: true
	// 2 1
}

// Each subscriber decides what Publish does when it is full (OnFull): Block
// waits for room until Publish's context ends, Reject refuses, DropNewest
// drops and counts. Publish's *PublishError names every subscriber that did
// not take the event, with its reason.
func ExampleOnFull() {
	ctx := context.Background()
	b, _ := bus.New[string](bus.WithWorkers(4))
	release := make(chan struct{})
	started := make(chan struct{}, 3)
	slow := func(context.Context, bus.Envelope[string], OrderPlaced) error {
		started <- struct{}{}
		<-release
		return nil
	}
	for _, p := range []bus.OverflowPolicy{bus.Block, bus.Reject, bus.DropNewest} {
		if _, err := bus.Subscribe(b, p.String(), slow, bus.MaxKeyDepth(1), bus.OnFull(p)); err != nil {
			panic(err)
		}
	}
	b.Publish(ctx, "frank", OrderPlaced{Order: "o-1"}) // each subscriber's one slot for frank
	<-started
	<-started
	<-started

	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	err := b.Publish(short, "frank", OrderPlaced{Order: "o-2"}) // every subscriber is full
	var pe *bus.PublishError
	errors.As(err, &pe)
	for _, name := range []string{"Block", "Reject", "DropNewest"} {
		why := pe.Refused[name]
		fmt.Printf("%s: key full %t, waited until the deadline %t, dropped %t\n", name,
			errors.Is(why, keysched.ErrKeyFull), errors.Is(why, context.DeadlineExceeded), errors.Is(why, bus.ErrDropped))
	}
	close(release)
	b.Close(ctx)
	// Output:
	// Block: key full true, waited until the deadline true, dropped false
	// Reject: key full true, waited until the deadline false, dropped false
	// DropNewest: key full true, waited until the deadline false, dropped true
}

// With Failure(keysched.Park) a key whose event failed for good stops for
// that subscriber, its later events waiting behind it, until Resume handles
// the event again (or Skip gives it up).
func ExampleSubscription_Resume() {
	ctx := context.Background()
	b, _ := bus.New[string](bus.WithWorkers(2))
	defer b.Close(ctx)

	var down atomic.Bool
	down.Store(true)
	parked := make(chan string, 1)
	sub, _ := bus.Subscribe(b, "warehouse",
		func(ctx context.Context, env bus.Envelope[string], e OrderPlaced) error {
			if down.Load() {
				return errors.New("warehouse API down")
			}
			fmt.Println("reserved stock for", e.Order)
			return nil
		},
		bus.Failure(keysched.Park),
		bus.DeadLetters(func(dl bus.DeadLetter[string]) { parked <- dl.Envelope.Key }),
	)
	b.Publish(ctx, "gina", OrderPlaced{Order: "o-1"})
	b.Publish(ctx, "gina", OrderPlaced{Order: "o-2"}) // waits behind o-1
	<-parked
	fmt.Println("parked:", sub.Parked()) // a []string: the bus's key type

	down.Store(false) // the API is back
	if err := sub.Resume("gina"); err != nil {
		panic(err)
	}
	sub.Drain(ctx)
	fmt.Println("parked:", sub.Parked())
	// Output:
	// parked: [gina]
	// reserved stock for o-1
	// reserved stock for o-2
	// parked: []
}

// Skip gives up a parked key's failed event (it was dead-lettered when the
// key parked) and moves the key on.
func ExampleSubscription_Skip() {
	ctx := context.Background()
	b, _ := bus.New[int](bus.WithWorkers(2))
	defer b.Close(ctx)

	parked := make(chan int, 1)
	sub, _ := bus.Subscribe(b, "indexer",
		func(ctx context.Context, env bus.Envelope[int], e OrderPlaced) error {
			if e.Total < 0 {
				return errors.New("negative total")
			}
			fmt.Println("indexed", e.Order)
			return nil
		},
		bus.Failure(keysched.Park),
		bus.DeadLetters(func(dl bus.DeadLetter[int]) {
			fmt.Println("dead letter:", dl.Envelope.Event.(OrderPlaced).Order, dl.Err)
			parked <- dl.Envelope.Key
		}),
	)
	b.Publish(ctx, 7, OrderPlaced{Order: "o-1", Total: -5})
	b.Publish(ctx, 7, OrderPlaced{Order: "o-2", Total: 5})
	key := <-parked
	if err := sub.Skip(key); err != nil {
		panic(err)
	}
	sub.Drain(ctx)
	fmt.Println(errors.Is(sub.Skip(key), keysched.ErrNotParked))
	// Output:
	// dead letter: o-1 negative total
	// indexed o-2
	// true
}

// Dedup makes a handler idempotent by event ID: a redelivered event (the
// same envelope published again, or replayed from a dead letter) is skipped.
func ExampleDedup() {
	ctx := context.Background()
	b, _ := bus.New[string](bus.WithWorkers(2))
	defer b.Close(ctx)

	var charged atomic.Int32
	charge := func(ctx context.Context, env bus.Envelope[string], e OrderPlaced) error {
		charged.Add(int32(e.Total))
		return nil
	}
	once, err := bus.Dedup(charge, 10_000)
	if err != nil {
		panic(err)
	}
	bus.Subscribe(b, "billing", once)
	ev := bus.Envelope[string]{ID: "evt-1", Key: "hana", Event: OrderPlaced{Order: "o-1", Total: 25}}
	b.PublishEnvelope(ctx, ev)
	b.PublishEnvelope(ctx, ev) // delivered again: skipped
	b.Drain(ctx)
	fmt.Println(charged.Load())
	// Output: 25
}

// EjectAfter removes a subscriber that keeps timing out: its queued events
// are dead-lettered with ErrEjected, Publish skips it, and the other
// subscribers carry on.
func ExampleEjectAfter() {
	ctx := context.Background()
	b, _ := bus.New[string](bus.WithWorkers(2), bus.WithLogger(slog.New(slog.DiscardHandler)))
	defer b.Close(ctx)

	hung, _ := bus.Subscribe(b, "hung",
		func(ctx context.Context, env bus.Envelope[string], e OrderPlaced) error {
			<-ctx.Done() // a dependency that never answers
			return ctx.Err()
		},
		bus.Timeout(5*time.Millisecond), bus.EjectAfter(1),
		bus.DeadLetters(func(dl bus.DeadLetter[string]) {}),
	)
	b.Publish(ctx, "ivan", OrderPlaced{Order: "o-1"})
	hung.Drain(ctx)
	b.Publish(ctx, "ivan", OrderPlaced{Order: "o-2"}) // skipped: not an error
	st := hung.Stats()
	fmt.Println(st.Ejected, st.Skipped)
	// Output: true 1
}
