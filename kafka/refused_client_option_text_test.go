package kafka

import (
	"context"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A client option franz-go refuses is named once in NewConsumer's error:
// franz-go's error is the *keysched.OptionError's Err, which its text ends
// with (it was in the reason too: "...: max record batch bytes -1 is less
// than allowed 512: max record batch bytes -1 is less than allowed 512").
func TestRefusedClientOptionSaysFranzGosErrorOnce(t *testing.T) {
	h := func(context.Context, *kgo.Record) error { return nil }
	_, err := NewConsumer(h, WithClientOptions(kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("g"),
		kgo.ConsumeTopics("t"), kgo.ProducerBatchMaxBytes(-1)))
	if err == nil {
		t.Fatal("accepted")
	}
	const franz = "max record batch bytes -1 is less than allowed 512"
	if n := strings.Count(err.Error(), franz); n != 1 {
		t.Errorf("franz-go's error %d times in %q", n, err)
	}
}
