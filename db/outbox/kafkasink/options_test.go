package kafkasink_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keysched/keysched/db/outbox/kafkasink"
	"github.com/keysched/keysched/internal/opttest"
)

// Each Option New refuses is a *keysched.OptionError naming it, as every
// keysched module's refused option is: errors.As finds it, errors.Is
// matches kafkasink.ErrInvalidOption and keysched.ErrInvalidOption.
func TestRefusedOptionIsAnOptionErrorNamingIt(t *testing.T) {
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	require.NoError(t, err)
	defer cl.Close()
	for _, tc := range []struct {
		opts   []kafkasink.Option
		option string
	}{
		{[]kafkasink.Option{kafkasink.WithTopicFunc(nil)}, "WithTopicFunc"},
		{[]kafkasink.Option{nil}, "opts[0]"},
	} {
		_, err := kafkasink.New(cl, "t", tc.opts...)
		require.Empty(t, opttest.Problem(err, opttest.Want{Option: tc.option,
			Prefix: "kafkasink: invalid option: ", Sentinels: []error{kafkasink.ErrInvalidOption}}))
	}
}
