package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/bus"
)

// BusSink returns a Sink that publishes each event on b, keyed by the
// event's key, in an envelope carrying its ID, headers and creation time.
// The bus event is decode(e), or the Event itself when decode is nil; a
// decode error, or a nil event with no error, is permanent (the row is
// marked dead without retries, since decoding the same row again fails
// again; the nil event's error wraps bus.ErrNilEvent and names the event).
//
// A bus is in memory: "published" means every matching subscriber accepted
// the event (PublishEnvelopeStrict returned nil), not that it was handled,
// and a process exit loses what its subscribers had queued. An event that no
// subscriber takes (decode returned a type no subscriber is subscribed to,
// such as a *T for a subscriber of T, or the relay ran before Subscribe; or
// its only subscribers were ejected by bus.EjectAfter, or unsubscribed) is
// not published: the sink returns a retryable error wrapping
// bus.ErrNoSubscriber that names the event's ID, its key and the Go type
// decode returned, so that a subscriber registered later gets it on a
// retry, and once the relay's retry policy (WithRetry) gives up the row is
// marked dead and kept (Outbox.Dead, Recover), never deleted as sent. When some subscribers
// refuse the event (*bus.PublishError), the sink returns that error and the
// retry publishes the event again to all of them: the subscribers that had
// accepted it get it twice (use bus.Dedup, keyed on the event ID).
//
// An event a subscriber accepted (queued) but whose handler never ran is
// not the sink's to keep: the relay marked its row sent when the subscriber
// took it. That is the case of a subscriber ejected (bus.EjectAfter) with
// events queued, whose queued events are dead-lettered with bus.ErrEjected
// and Attempts 0, and of an Unsubscribe or a bus Close that gives up
// (keysched.ErrAborted); as an event whose handler fails for good, they
// reach the subscriber's bus.DeadLetters function (by default only a
// warning in the bus's log). A subscriber that must not lose one gives a
// DeadLetters function that keeps it (for instance writes it back to an
// outbox).
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
			if v == nil {
				// As a decode error: decoding the same row again gives nil
				// again (the bus refuses a nil event, bus.ErrNilEvent).
				return permanent(fmt.Errorf("outbox: BusSink: decode event %s (key %q) returned a nil event and no error: %w", e.ID, e.Key, bus.ErrNilEvent))
			}
			ev = v
		}
		err := b.PublishEnvelopeStrict(ctx, bus.Envelope[string]{ID: e.ID, Key: e.Key, Event: ev, Headers: e.Headers, Published: e.CreatedAt})
		if errors.Is(err, bus.ErrNoSubscriber) {
			// Retryable: a subscriber may yet be registered (a relay started
			// before Subscribe); the retry policy bounds the wait.
			return fmt.Errorf("outbox: BusSink: event %s (key %q): no subscriber takes the type decode returned, %T (a subscriber of T does not take a *T; is one subscribed yet?): %w", e.ID, e.Key, ev, err)
		}
		return err
	}
}

// A Sink publishes one event: to a broker, a bus, an HTTP endpoint. It
// returns nil once the event is published (durably, for a broker); an error
// makes the relay retry it with its retry policy, then mark the row dead.
// Wrap an error with keysched.Permanent to give up at once, or with
// keysched.Snooze to try again later without spending an attempt (the sink
// refused locally: a full bulkhead, an open breaker, a rate limit; it still
// counts in RelayStats.SinkErrors).
//
// The relay calls a Sink for one key at a time, in the key's write order,
// and for different keys concurrently: a Sink must be safe for concurrent
// use. ctx ends when the relay's lease on the key ends (see the package doc)
// or when the relay shuts down: a Sink must return promptly then, and a
// publish still in flight after that may reach the broker after another relay
// has taken the key over (ClaimFrom(ctx) gives the call's claim epoch, a
// fencing token for the downstream). The same event can be published more
// than once (at-least-once): consumers deduplicate on Event.ID (see package
// inbox).
type Sink func(ctx context.Context, e Event) error

// A Claim is the claim under which a sink call publishes a row: the row's
// key, the relay's name (WithOwner) and fencing token (Relay.Token), and
// the claim's epoch. See ClaimFrom.
type Claim struct {
	Key   string
	Owner string
	Token string
	// Epoch is the claim's epoch: every claim of a key (a relay taking a
	// free key, or an expired lease over) takes a new one, greater than any
	// earlier claim's of the key (one counter per outbox, never reset, so
	// epochs are also unique across keys). It is >= 1.
	Epoch int64
}

type claimKey struct{}

// ClaimFrom returns the claim of the sink call whose context is ctx, and
// whether ctx is one (ok is false for any other context, nil included).
//
// The epoch is a fencing token for downstreams: a relay that pauses past its
// lease (a GC pause, a VM migration, SIGSTOP) may resume in the middle of a
// sink call that then lands after another relay took the key over, whatever
// the relay does, since the call is already on its way. A downstream that
// stores each key's highest epoch with its write (a Kafka transactional ID
// derived from it, a row version column, an HTTP header such as
// "Fencing-Epoch" checked by the receiver) and refuses a write of a lower
// epoch for that key turns such a late write into a refusal. Compare epochs
// of one key only; within one claim, its rows arrive in order, and a new
// claim starts again from the key's oldest pending row.
func ClaimFrom(ctx context.Context) (Claim, bool) {
	if ctx == nil {
		return Claim{}, false
	}
	c, ok := ctx.Value(claimKey{}).(Claim)
	return c, ok
}

func permanent(err error) error { return keysched.Permanent(err) }
