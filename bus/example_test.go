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
