package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/keysched/keysched/internal/opttest"
)

// Every refusal of Replay's options (a ReplayOptions field, a client
// option) is a *keysched.OptionError naming it, matching
// keysched.ErrInvalidOption and ErrInvalidOption, as every module's refused
// option is (they wrapped ErrInvalidOption alone: errors.As found nothing,
// and errors.Is(err, keysched.ErrInvalidOption) was false). A nil client
// option is refused too (franz-go dereferenced it: a panic).
func TestReplayRefusalIsAnOptionErrorNamingIt(t *testing.T) {
	tc := newCluster(t, 1, "dlq")
	at := time.Now()
	for _, c := range []struct {
		option string
		o      ReplayOptions
		opts   []kgo.Opt
	}{
		{"ReplayOptions.DeadLetterTopic", ReplayOptions{}, nil},
		{"ReplayOptions.EndOffset", ReplayOptions{DeadLetterTopic: "dlq", StartOffset: 5, EndOffset: 5}, nil},
		{"ReplayOptions.StartOffset", ReplayOptions{DeadLetterTopic: "dlq", StartOffset: -1}, nil},
		{"ReplayOptions.EndOffset", ReplayOptions{DeadLetterTopic: "dlq", EndOffset: -1}, nil},
		{"ReplayOptions.Until", ReplayOptions{DeadLetterTopic: "dlq", Since: at, Until: at}, nil},
		{"ReplayOptions.TimeOf", ReplayOptions{DeadLetterTopic: "dlq", TimeOf: 7}, nil},
		{"ReplayOptions.MaxReplays", ReplayOptions{DeadLetterTopic: "dlq", MaxReplays: -1}, nil},
		{"ReplayOptions.Partitions", ReplayOptions{DeadLetterTopic: "dlq", Partitions: []int32{-1}}, nil},
		{"ReplayOptions.DeadLetterPartitions", ReplayOptions{DeadLetterTopic: "dlq", DeadLetterPartitions: []int32{-1}}, nil},
		{"ReplayOptions.Topics", ReplayOptions{DeadLetterTopic: "dlq", Topics: []string{""}}, nil},
		{"clientOpts[2]", ReplayOptions{DeadLetterTopic: "dlq"}, []kgo.Opt{nil}},
		{"clientOpts", ReplayOptions{DeadLetterTopic: "dlq"}, []kgo.Opt{kgo.ProducerBatchMaxBytes(-1)}},
		{"kgo.DisableIdempotentWrite", ReplayOptions{DeadLetterTopic: "dlq"}, []kgo.Opt{kgo.DisableIdempotentWrite()}},
		{"kgo.TransactionalID", ReplayOptions{DeadLetterTopic: "dlq"}, []kgo.Opt{kgo.TransactionalID("x")}},
		{"kgo.ConsumerGroup", ReplayOptions{DeadLetterTopic: "dlq"}, []kgo.Opt{kgo.ConsumerGroup("g")}},
		{"kgo.ManualFlushing", ReplayOptions{DeadLetterTopic: "dlq"}, []kgo.Opt{kgo.ManualFlushing()}},
	} {
		rep, err := Replay(context.Background(), c.o, append(replayOpts(tc), c.opts...)...)
		if p := opttest.Problem(err, opttest.Want{Option: c.option, Prefix: "kafka: invalid option: ", Sentinels: []error{ErrInvalidOption}}); p != "" {
			t.Error(p)
		}
		if rep != nil {
			t.Errorf("%s: a report with a refused option: %+v", c.option, rep)
		}
	}
}

// Replay refuses client options that consume (kgo.ConsumeTopics,
// kgo.ConsumePartitions): it reads the dead-letter topic itself. They were
// accepted for another topic (its clients set to consume it too); for the
// dead-letter topic franz-go refused them only when Replay made its reading
// client, after the topic's offsets were listed, and Replay returned a
// report with that invalid option.
func TestReplayRefusesClientOptionsThatConsume(t *testing.T) {
	tc := newCluster(t, 1, "t", "dlq")
	for _, c := range []struct {
		option string
		opt    kgo.Opt
	}{
		{"kgo.ConsumeTopics", kgo.ConsumeTopics("t")},
		{"kgo.ConsumeTopics", kgo.ConsumeTopics("dlq")},
		{"kgo.ConsumePartitions", kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"t": {0: kgo.NewOffset().AtStart()}})},
		// Alone it consumes nothing, but franz-go refuses it with the
		// reading client's direct partitions: late, after the offsets
		// were listed, and named "clientOpts".
		{"kgo.ConsumeRegex", kgo.ConsumeRegex()},
	} {
		rep, err := Replay(context.Background(), ReplayOptions{DeadLetterTopic: "dlq", DryRun: true}, append(replayOpts(tc), c.opt)...)
		if p := opttest.Problem(err, opttest.Want{Option: c.option, Prefix: "kafka: invalid option: ", Sentinels: []error{ErrInvalidOption}}); p != "" {
			t.Error(p)
		}
		if rep != nil {
			t.Errorf("%s: a report with a refused option: %+v", c.option, rep)
		}
	}
}
