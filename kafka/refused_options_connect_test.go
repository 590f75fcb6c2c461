package kafka

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A NewConsumer refused for its client options opens no connection to the
// brokers: the client it makes to read the caller's options (is there a
// group?) consumes nothing. Before, that client started consuming the
// caller's topics: it asked the seed broker for metadata at once (most
// runs under -race) and, with a group (kgo.AutoCommitMarks refused next to
// the adapter's DisableAutoCommit), sometimes sent JoinGroup for it before
// it was closed: a rebalance of the group's live members.
func TestRefusedClientOptionsOpenNoConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			_ = c.Close()
		}
	}()
	defer ln.Close()
	h := func(context.Context, *kgo.Record) error { return nil }
	seed := kgo.SeedBrokers(ln.Addr().String())
	for name, opts := range map[string][]kgo.Opt{
		"no group":         {seed, kgo.ConsumeTopics("t")},
		"autocommit marks": {seed, kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"), kgo.AutoCommitMarks()},
		"no group, regex":  {seed, kgo.ConsumeTopics("t.*"), kgo.ConsumeRegex()},
		"no group, parts":  {seed, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"t": {0: kgo.NewOffset()}})},
	} {
		// The client's first dial races its Close: try enough times.
		for range 20 {
			c, err := NewConsumer(h, WithClientOptions(opts...))
			if !errors.Is(err, ErrInvalidOption) || c != nil {
				t.Fatalf("%s: %v, want ErrInvalidOption", name, err)
			}
		}
	}
	time.Sleep(20 * time.Millisecond) // an accept in flight is counted
	if n := conns.Load(); n != 0 {
		t.Errorf("refused NewConsumers opened %d connections to the seed broker", n)
	}
}
