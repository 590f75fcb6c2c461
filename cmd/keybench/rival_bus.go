package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/keysched/keysched/bus"
)

// The event bus (package bus) as a rival: one subscriber on a bus of
// --workers, each event published under its key. Against "chain" it measures
// what the bus adds over the bare scheduler: envelope and UUIDv7 id, type
// routing, the fan-out and its bookkeeping.
func init() {
	register(rivalInfo{
		Name: "bus", Order: 50, Ordered: true, New: newBusRival,
		Doc: "package bus: one typed subscriber on a bus of --workers (keysched underneath); --queue pending, --key-depth per key",
	})
}

// busTask is the event the rival publishes: the work itself. A func is
// pointer-shaped, so putting one in the envelope's Event allocates nothing.
type busTask func(context.Context) error

type busRival struct {
	b   *bus.Bus[string]
	sub *bus.Subscription[string]
}

func newBusRival(c rivalConfig) (rival, error) {
	b, err := bus.New[string](bus.WithWorkers(c.Workers), bus.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return nil, err
	}
	var opts []bus.SubOption // Block (the default): Publish waits for room, as chain's Submit does
	if c.Queue > 0 {
		opts = append(opts, bus.MaxPending(c.Queue))
	}
	if c.KeyDepth > 0 {
		opts = append(opts, bus.MaxKeyDepth(c.KeyDepth))
	}
	sub, err := bus.Subscribe(b, "keybench", func(ctx context.Context, _ bus.Envelope[string], task busTask) error {
		return task(ctx)
	}, opts...)
	if err != nil {
		_ = b.Close(context.Background())
		return nil, err
	}
	return &busRival{b: b, sub: sub}, nil
}

func (r *busRival) Submit(ctx context.Context, key string, fn func()) error {
	return r.SubmitTask(ctx, key, func(context.Context) error { fn(); return nil })
}

// SubmitTask publishes task as the event for key. A refusal (the context
// ended while Publish waited for room) comes back as a *bus.PublishError that
// wraps ctx's error.
func (r *busRival) SubmitTask(ctx context.Context, key string, task func(context.Context) error) error {
	return r.b.Publish(ctx, key, busTask(task))
}

func (r *busRival) Close() error {
	ctx := context.Background()
	if err := r.b.Drain(ctx); err != nil {
		return err
	}
	if err := r.b.Close(ctx); err != nil {
		return err
	}
	st := r.sub.Stats()
	if st.Succeeded != st.Submitted || st.Pending != 0 || st.Dropped != 0 || st.Rejected != 0 {
		return fmt.Errorf("bus: %d submitted, %d succeeded, %d failed, %d panicked, %d aborted, %d pending, %d refused, %d dropped",
			st.Submitted, st.Succeeded, st.Failed, st.Panicked, st.Aborted, st.Pending, st.Rejected, st.Dropped)
	}
	return nil
}
