package bus

import (
	"context"
	"testing"

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
