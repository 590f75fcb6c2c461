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

// A client New refuses for one of its options (no acks, manual flushing,
// transactional) is refused with a *keysched.OptionError naming that
// client option, as the Kafka consumer refuses client options (they
// wrapped kafkasink.ErrInvalidOption alone: errors.As found nothing, and
// errors.Is(err, keysched.ErrInvalidOption) was false).
func TestRefusedClientOptionIsAnOptionErrorNamingIt(t *testing.T) {
	for _, tc := range []struct {
		opt    kgo.Opt
		option string
	}{
		{kgo.RequiredAcks(kgo.NoAck()), "kgo.RequiredAcks"},
		{kgo.ManualFlushing(), "kgo.ManualFlushing"},
		{kgo.TransactionalID("tx"), "kgo.TransactionalID"},
	} {
		opts := []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1"), tc.opt}
		if tc.option == "kgo.RequiredAcks" {
			opts = append(opts, kgo.DisableIdempotentWrite())
		}
		cl, err := kgo.NewClient(opts...)
		require.NoError(t, err)
		_, err = kafkasink.New(cl, "t")
		cl.Close()
		require.Empty(t, opttest.Problem(err, opttest.Want{Option: tc.option,
			Prefix: "kafkasink: invalid option: ", Sentinels: []error{kafkasink.ErrInvalidOption}}))
	}
}

// New's own arguments are refused as its options are: a nil client, no
// topic, a topic Kafka refuses are *keysched.OptionError naming New(cl) or
// New(topic) (they wrapped kafkasink.ErrInvalidOption alone).
func TestRefusedArgumentIsAnOptionErrorNamingIt(t *testing.T) {
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	require.NoError(t, err)
	defer cl.Close()
	for _, tc := range []struct {
		cl     *kgo.Client
		topic  string
		option string
	}{
		{nil, "t", "New(cl)"},
		{cl, "", "New(topic)"},
		{cl, "a b", "New(topic)"},
	} {
		_, err := kafkasink.New(tc.cl, tc.topic)
		require.Empty(t, opttest.Problem(err, opttest.Want{Option: tc.option,
			Prefix: "kafkasink: invalid option: ", Sentinels: []error{kafkasink.ErrInvalidOption}}))
	}
}
