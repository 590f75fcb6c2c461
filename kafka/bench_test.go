package kafka

import (
	"context"
	"fmt"
	"testing"

	"github.com/keysched/keysched"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkDispatch measures the adapter's own cost per record, without a
// broker: routing a poll's records into the scheduler, running a no-op
// handler, tracking the frontier.
func BenchmarkDispatch(b *testing.B) {
	for _, keys := range []int{8, 10000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			done := make(chan struct{}, 1)
			var n int
			c := &Consumer{cfg: defaultConfig(), parts: map[tp]*partition{}, runCtx: context.Background(), log: quiet}
			c.cfg.maxInFlight = 1 << 30
			s, err := keysched.New[schedKey](keysched.WithLogger(quiet), keysched.WithMaxKeyDepth(1<<30), keysched.WithMaxPending(1<<30))
			if err != nil {
				b.Fatal(err)
			}
			c.sched = s
			total := b.N
			c.h = func(ctx context.Context, r *kgo.Record) error { return nil }
			p := newPartition(c, "t", 0, 1)
			c.parts[tp{"t", 0}] = p
			keyNames := make([][]byte, keys)
			for i := range keyNames {
				keyNames[i] = fmt.Appendf(nil, "some/path/file-%d.c", i)
			}
			const batch = 1000
			b.ReportAllocs()
			b.ResetTimer()
			for off := 0; off < total; off += batch {
				var rs []*kgo.Record
				for i := off; i < min(off+batch, total); i++ {
					rs = append(rs, &kgo.Record{Topic: "t", Key: keyNames[i%keys], Offset: int64(i)})
				}
				c.route(kgo.FetchTopicPartition{Topic: "t", FetchPartition: kgo.FetchPartition{Records: rs}})
			}
			if err := s.Drain(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			p.mu.Lock()
			if f, _, _ := p.frontier(); f != int64(total) {
				b.Fatalf("frontier %d, want %d", f, total)
			}
			p.mu.Unlock()
			_ = s.Close(context.Background())
			_, _ = done, n
		})
	}
}
