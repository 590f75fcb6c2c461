package bus

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// PublishEnvelopeStrict refuses an event no subscriber matches, naming its
// type, where PublishEnvelope returns nil: a subscriber of tick does not
// take a *tick, and one subscribed after the call does not get it. Once a
// subscriber matches, the same event is delivered.
func TestPublishEnvelopeStrictRefusesAnEventNoSubscriberTakes(t *testing.T) {
	ctx := context.Background()
	b := newBus[string](t)
	env := Envelope[string]{ID: "e1", Key: "k", Event: &tick{N: 1}}

	err := b.PublishEnvelopeStrict(ctx, env)
	require.ErrorIs(t, err, ErrNoSubscriber, "no subscriber at all")
	require.Contains(t, err.Error(), "*bus.tick")

	got := make(chan Envelope[string], 1)
	_, err = Subscribe(b, "values", func(_ context.Context, env Envelope[string], _ tick) error {
		got <- env
		return nil
	})
	require.NoError(t, err)
	err = b.PublishEnvelopeStrict(ctx, env)
	require.ErrorIs(t, err, ErrNoSubscriber, "a subscriber of tick does not take a *tick")
	require.Contains(t, err.Error(), "*bus.tick")
	require.NoError(t, b.PublishEnvelope(ctx, env), "PublishEnvelope only counts it")
	require.EqualValues(t, 3, b.Stats().Unmatched)

	_, err = Subscribe(b, "pointers", func(_ context.Context, env Envelope[string], _ *tick) error {
		got <- env
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, b.PublishEnvelopeStrict(ctx, env), "a subscriber registered later gets the retry")
	require.Equal(t, "e1", recv(t, got, "delivery").ID)
	require.EqualValues(t, 3, b.Stats().Unmatched)
}

// A subscriber unsubscribed while PublishEnvelopeStrict waits to offer it
// the event (a Block subscriber full on the key) did not take it: with no
// other subscriber, the event was received by nobody, and the error says
// so (it returned nil, as PublishEnvelope does).
func TestPublishEnvelopeStrictRefusesAnEventItsSubscriberLeftBeforeTaking(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := newBus[string](t)
		started, release := make(chan struct{}), make(chan struct{})
		sub, err := Subscribe(b, "slow", func(ctx context.Context, _ Envelope[string], _ tick) error {
			close(started)
			<-release
			return nil
		}, MaxKeyDepth(1), OnFull(Block))
		require.NoError(t, err)
		require.NoError(t, b.PublishEnvelopeStrict(ctx, Envelope[string]{ID: "e1", Key: "k", Event: tick{N: 1}}))
		<-started
		published := make(chan error, 1)
		go func() {
			published <- b.PublishEnvelopeStrict(ctx, Envelope[string]{ID: "e2", Key: "k", Event: tick{N: 2}})
		}()
		synctest.Wait() // e2 waits for room on k
		unsubscribed := make(chan error, 1)
		go func() { unsubscribed <- sub.Unsubscribe(ctx) }()
		err = <-published
		require.ErrorIs(t, err, ErrNoSubscriber)
		require.Contains(t, err.Error(), "ejected or unsubscribed while it was offered")
		close(release)
		require.NoError(t, <-unsubscribed)
	})
}

// An ejected subscriber (EjectAfter) skips the events offered to it: with no
// other subscriber, PublishEnvelopeStrict says nobody took the event (it
// returned nil, so a durable outbox's relay deleted events nobody
// received).
func TestPublishEnvelopeStrictRefusesAnEventOnlyAnEjectedSubscriberMatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		b := newBus[string](t)
		x, err := Subscribe(b, "x", sleepy, Timeout(time.Second), EjectAfter(1), MaxConcurrency(1))
		require.NoError(t, err)
		require.NoError(t, b.PublishEnvelopeStrict(ctx, Envelope[string]{ID: "e0", Key: "k", Event: tick{N: 0}}))
		require.NoError(t, b.Drain(ctx))
		require.True(t, x.Stats().Ejected)
		err = b.PublishEnvelopeStrict(ctx, Envelope[string]{ID: "e1", Key: "k", Event: tick{N: 1}})
		require.ErrorIs(t, err, ErrNoSubscriber)
		require.Contains(t, err.Error(), "ejected or unsubscribed")
		require.NoError(t, b.PublishEnvelope(ctx, Envelope[string]{ID: "e2", Key: "k", Event: tick{N: 2}}), "PublishEnvelope skips it as before")
		require.EqualValues(t, 2, x.Stats().Skipped)
	})
}
