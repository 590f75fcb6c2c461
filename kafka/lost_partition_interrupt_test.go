package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A lost partition (the heartbeat says the member is unknown: the group
// dropped it, and another member may own the partition and handle the same
// records) cancels its running handlers at once rather than after the
// revoke timeout (a minute here), under each group protocol. Input that
// broke it: a handler waiting for its context on a lost partition ran the
// whole revoke timeout.
func TestLostPartitionInterruptsHandlersAtOnce(t *testing.T) {
	for _, proto := range groupProtocols {
		t.Run(string(proto), func(t *testing.T) {
			tc := newCluster(t, 1, "t")
			tc.produce(t, rec("t", 0, "a", "0"))
			group := groupName(t)
			running := make(chan struct{}, 1)
			interrupted := make(chan struct{}, 1)
			startConsumer(t, func(ctx context.Context, r *kgo.Record) error {
				select {
				case running <- struct{}{}:
				default:
				}
				<-ctx.Done()
				select {
				case interrupted <- struct{}{}:
				default:
				}
				return ctx.Err()
			}, WithLogger(quiet), WithCommitInterval(time.Hour), WithRevokeTimeout(time.Minute),
				WithClientOptions(append(tc.clientOptsFor(proto, group, "t"), kgo.RebalanceTimeout(2*time.Minute))...))
			select {
			case <-running:
			case <-time.After(20 * time.Second):
				t.Fatal("the handler did not start")
			}
			tc.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Heartbeat, kmsg.ConsumerGroupHeartbeat}, Group: group, Err: kerr.UnknownMemberID, TopLevel: true})
			select {
			case <-interrupted:
			case <-time.After(15 * time.Second): // generous: a loaded machine; the revoke timeout is a minute
				t.Fatal("the lost partition's handler not interrupted within 15 s (revoke timeout: a minute)")
			}
		})
	}
}
