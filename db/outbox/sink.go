package outbox

import (
	"context"
	"fmt"

	"github.com/keysched/keysched/bus"
)

// BusSink returns a Sink that publishes each event on b, keyed by the
// event's key, in an envelope carrying its ID, headers and creation time.
// The bus event is decode(e), or the Event itself when decode is nil; a
// decode error is permanent (the row is marked dead without retries, since
// decoding the same row again fails again).
//
// A bus is in memory: "published" means every matching subscriber accepted
// the event (PublishEnvelope returned nil), not that it was handled, and a
// process exit loses what its subscribers had queued. When some subscribers
// refuse the event (*bus.PublishError), the sink returns that error and the
// retry publishes the event again to all of them: the subscribers that had
// accepted it get it twice (use bus.Dedup, keyed on the event ID).
// A nil b makes a Sink that fails every call with an error.
func BusSink(b *bus.Bus[string], decode func(Event) (any, error)) Sink {
	return func(ctx context.Context, e Event) error {
		if b == nil {
			return permanent(fmt.Errorf("outbox: BusSink: nil bus"))
		}
		var ev any = e
		if decode != nil {
			v, err := decode(e)
			if err != nil {
				return permanent(fmt.Errorf("outbox: BusSink: decode event %s: %w", e.ID, err))
			}
			ev = v
		}
		return b.PublishEnvelope(ctx, bus.Envelope[string]{ID: e.ID, Key: e.Key, Event: ev, Headers: e.Headers, Published: e.CreatedAt})
	}
}
