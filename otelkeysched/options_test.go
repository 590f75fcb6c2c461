package otelkeysched_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/keysched/keysched/internal/opttest"
	"github.com/keysched/keysched/otelkeysched"
)

// Each Option New refuses is a *keysched.OptionError naming it, wrapped
// "otelkeysched: ...", as every keysched module's refused option is:
// errors.As finds it, errors.Is matches keysched.ErrInvalidOption.
func TestRefusedOptionIsAnOptionErrorNamingIt(t *testing.T) {
	for _, tc := range []struct {
		opts   []otelkeysched.Option
		option string
	}{
		{[]otelkeysched.Option{otelkeysched.WithAttributes(attribute.KeyValue{})}, "WithAttributes"},
		{[]otelkeysched.Option{otelkeysched.WithAttributes(otelkeysched.OutcomeKey.String("x"))}, "WithAttributes"},
		{[]otelkeysched.Option{otelkeysched.WithAttributes(otelkeysched.SubscriptionKey.String("x"))}, "WithAttributes"},
		{[]otelkeysched.Option{otelkeysched.ForSubscription("")}, "ForSubscription"},
		{[]otelkeysched.Option{otelkeysched.ForSubscription("s"), nil}, "opts[1]"},
	} {
		_, err := otelkeysched.New[string](noop.NewMeterProvider(), tc.opts...)
		require.Empty(t, opttest.Problem(err, opttest.Want{Option: tc.option, Prefix: "otelkeysched: keysched: invalid option: "}))
	}
}
