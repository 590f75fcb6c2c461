package kafka

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// metaPrefix starts the commit metadata that lists the offsets finished above
// the committed frontier: "ks1:<frontier>:<gap>.<len>,..." in base 36, each
// run of finished offsets given by its distance from the end of the previous
// run (or from the frontier) and its length.
const metaPrefix = "ks1:"

// encodeFinished encodes the finished offsets in (base, highest] given the
// unfinished ones, ascending (usually starting with base, but the list may
// start above it: records finish without p.mu, so base may have finished
// since the frontier was taken; every listed offset above base counts as
// unfinished). complete says whether the list holds every unfinished offset
// up to highest, or was cut short. Runs
// are written nearest the frontier first, and as many as fit in limit bytes:
// when they do not all fit (or the list was cut short), the encoding is the
// longest prefix that fits and truncated is true; "" when even the first run
// does not fit, or there is nothing to say. Offsets past the last listed
// unfinished one are claimed only when the list is complete (a list cut
// short is not "truncated": only the limit in bytes makes that).
func encodeFinished(base int64, unfinished []int64, complete bool, highest int64, limit int) (meta string, truncated bool) {
	if len(unfinished) == 0 {
		return "", false // all finished: the frontier says it all
	}
	var b []byte
	prev := base // the last offset not covered by a run
	// add appends the run [from, to] if it fits; false when it does not.
	add := func(from, to int64) bool {
		n := len(b)
		if n == 0 {
			b = append(b, metaPrefix...)
			b = strconv.AppendInt(b, base, 36)
			b = append(b, ':')
		} else {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, from-prev, 36)
		b = append(b, '.')
		b = strconv.AppendInt(b, to-from+1, 36)
		if len(b) > limit {
			b = b[:n]
			return false
		}
		prev = to
		return true
	}
	last := base
	for _, u := range unfinished {
		if u <= base {
			continue // base itself (the list may start above it: see commitLocked)
		}
		if u > last+1 && !add(last+1, u-1) {
			return string(b), true
		}
		last = u
	}
	if !complete {
		return string(b), false
	}
	if highest > last && !add(last+1, highest) {
		return string(b), true
	}
	return string(b), false
}

// decodeFinished parses commit metadata written by encodeFinished for the
// committed offset base; nil when it is not such metadata or is for another
// offset.
func decodeFinished(meta string, base int64) []span {
	rest, ok := strings.CutPrefix(meta, metaPrefix)
	if !ok || base < 0 {
		return nil
	}
	b, runs, ok := strings.Cut(rest, ":")
	if !ok {
		return nil
	}
	if v, err := strconv.ParseInt(b, 36, 64); err != nil || v != base {
		return nil
	}
	var out []span
	prev := base
	for r := range strings.SplitSeq(runs, ",") {
		g, l, ok := strings.Cut(r, ".")
		if !ok {
			return nil
		}
		gap, err1 := strconv.ParseInt(g, 36, 64)
		n, err2 := strconv.ParseInt(l, 36, 64)
		// A run must start above the previous one and end within int64:
		// metadata is written by anyone sharing the group, and an overflow
		// would turn a run around (a claim nobody wrote).
		if err1 != nil || err2 != nil || gap < 1 || n < 1 || gap > math.MaxInt64-prev {
			return nil
		}
		from := prev + gap
		if n-1 > math.MaxInt64-from {
			return nil
		}
		to := from + n - 1
		out = append(out, span{from, to})
		prev = to
	}
	return out
}

// onOffsetsFetched reads back the committed offsets and their metadata of
// newly assigned partitions, before fetching starts.
func (c *Consumer) onOffsetsFetched(_ context.Context, _ *kgo.Client, resp *kmsg.OffsetFetchResponse) error {
	if !c.made() {
		return nil
	}
	for _, t := range resp.Topics {
		for _, pp := range t.Partitions {
			c.fetchedOffset(t.Topic, pp.Partition, pp.Offset, pp.Metadata)
		}
	}
	for _, g := range resp.Groups {
		for _, t := range g.Topics {
			for _, pp := range t.Partitions {
				c.fetchedOffset(t.Topic, pp.Partition, pp.Offset, pp.Metadata)
			}
		}
	}
	return nil
}

func (c *Consumer) fetchedOffset(topic string, part int32, off int64, meta *string) {
	p := c.lookup(topic, part)
	if p == nil || off < 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fetched {
		return
	}
	p.committed = off
	if meta != nil {
		p.committedMeta = *meta
		p.skip = decodeFinished(*meta, off)
	}
}

type pendingCommit struct {
	p    *partition
	off  int64
	meta string
}

// commit commits the frontiers of ps that are still owned (not lost, not
// revoked) and moved since their last commit, and returns those it could
// not commit.
func (c *Consumer) commit(ctx context.Context, ps []*partition, reason string) []UncommittedPartition {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	return c.commitLocked(ctx, ps, reason)
}

// commitLocked is commit with c.commitMu held. Holding it while the revoke
// removes a partition from the owned set fences commits: none is sent for a
// partition after its revoke or loss callback returned.
func (c *Consumer) commitLocked(ctx context.Context, ps []*partition, reason string) []UncommittedPartition {
	var list []pendingCommit
	lim := int(c.metaMax.Load())
	for _, p := range ps {
		if p.noCommit.Load() || c.lookup(p.topic, p.id) != p {
			continue
		}
		p.mu.Lock()
		off, _, ok := p.frontier()
		if !ok {
			p.mu.Unlock()
			continue
		}
		meta := ""
		if lim > 0 {
			unfinished := p.unfinished(lim)
			complete := len(unfinished) <= lim // else cut short: more unfinished ones follow
			var truncated bool
			meta, truncated = encodeFinished(off, unfinished, complete, p.highest, lim)
			if truncated && !p.metaWarned {
				p.metaWarned = true
				c.log.Info("kafka: finished offsets above the frontier do not fit the commit metadata; committing those nearest the frontier that fit (a new owner may handle the others again)",
					"topic", p.topic, "partition", p.id, "frontier", off, "limit_bytes", lim, "metadata_bytes", len(meta))
			}
		}
		if off < p.committed || (off == p.committed && meta == p.committedMeta) {
			p.mu.Unlock()
			continue
		}
		p.mu.Unlock()
		list = append(list, pendingCommit{p, off, meta})
	}
	failed := c.send(ctx, list, reason, true)
	switch {
	case len(list) == 0:
		// Nothing sent: no news about the broker (a recovery logged here
		// would be false while other partitions' commits are refused).
	case len(failed) == 0:
		c.commitLog.ok()
	case ctx.Err() == nil: // else ended by the caller (Close): reported there
		f := failed[0]
		c.commitLog.fail(f.Err, "reason", reason, "partitions_failed", len(failed), "topic", f.Topic, "partition", f.Partition, "frontier", f.Offset, "committed", f.Committed)
	}
	return failed
}

// send commits list and returns the partitions it could not commit, with
// the error of each.
func (c *Consumer) send(ctx context.Context, list []pendingCommit, reason string, withMeta bool) (failed []UncommittedPartition) {
	if len(list) == 0 {
		return nil
	}
	fail := func(pc *pendingCommit, err error) {
		c.commitErrs.Add(1)
		pc.p.mu.Lock()
		committed := pc.p.committed
		pc.p.mu.Unlock()
		failed = append(failed, UncommittedPartition{Topic: pc.p.topic, Partition: pc.p.id, Offset: pc.off, Committed: committed, Err: err})
	}
	offsets := make(map[string]map[int32]kgo.EpochOffset)
	byTP := make(map[tp]*pendingCommit, len(list))
	for i := range list {
		pc := &list[i]
		if !withMeta {
			pc.meta = ""
		}
		pc.p.mu.Lock()
		_, epoch, _ := pc.p.frontierEpoch(pc.off)
		pc.p.mu.Unlock()
		if offsets[pc.p.topic] == nil {
			offsets[pc.p.topic] = make(map[int32]kgo.EpochOffset)
		}
		offsets[pc.p.topic][pc.p.id] = kgo.EpochOffset{Epoch: epoch, Offset: pc.off}
		byTP[tp{pc.p.topic, pc.p.id}] = pc
	}
	pctx := kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
		for i := range req.Topics {
			t := &req.Topics[i]
			for j := range t.Partitions {
				pp := &t.Partitions[j]
				if pc := byTP[tp{t.Topic, pp.Partition}]; pc != nil {
					// Without a list, "" rather than franz-go's default
					// (the member ID): a new owner need not parse it.
					pp.Metadata = kmsg.StringPtr(pc.meta)
				}
			}
		}
		return nil
	})
	var tooLarge []pendingCommit
	c.cl.CommitOffsetsSync(pctx, offsets, func(_ *kgo.Client, req *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			for i := range list {
				fail(&list[i], err)
			}
			return
		}
		answered := make(map[*pendingCommit]bool, len(list))
		for i, t := range resp.Topics {
			topic := t.Topic
			if topic == "" && i < len(req.Topics) {
				topic = req.Topics[i].Topic
			}
			for _, pp := range t.Partitions {
				pc := byTP[tp{topic, pp.Partition}]
				if pc == nil || answered[pc] {
					continue
				}
				answered[pc] = true
				if e := kerr.ErrorForCode(pp.ErrorCode); e != nil {
					if errors.Is(e, kerr.OffsetMetadataTooLarge) && pc.meta != "" {
						tooLarge = append(tooLarge, *pc)
						continue
					}
					fail(pc, e)
					continue
				}
				pc.p.mu.Lock()
				if pc.off >= pc.p.committed {
					pc.p.committed, pc.p.committedMeta = pc.off, pc.meta
				}
				pc.p.mu.Unlock()
				c.commits.Add(1)
			}
		}
		for i := range list {
			if !answered[&list[i]] {
				fail(&list[i], errNoAnswer)
			}
		}
	})
	if len(tooLarge) > 0 {
		smallest := len(tooLarge[0].meta)
		for _, pc := range tooLarge {
			smallest = min(smallest, len(pc.meta))
			c.log.Warn("kafka: the broker refused the commit metadata as too large (offset.metadata.max.bytes); committing the frontier alone",
				"topic", pc.p.topic, "partition", pc.p.id, "frontier", pc.off, "metadata_bytes", len(pc.meta))
		}
		// Later commits keep under half of what was refused.
		for {
			cur := c.metaMax.Load()
			next := min(cur, int64(smallest/2))
			if c.metaMax.CompareAndSwap(cur, next) {
				break
			}
		}
		failed = append(failed, c.send(ctx, tooLarge, reason, false)...)
	}
	return failed
}

// errNoAnswer: the broker's answer to a commit did not mention a partition.
var errNoAnswer = errors.New("kafka: the commit's answer does not mention the partition")

// retriableCommit reports whether a commit that failed with err may succeed
// when sent again: the broker's retriable errors (the coordinator moving or
// loading, a request timing out), network errors, an answer without the
// partition. Fencing errors (REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION,
// UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID) and UNKNOWN_SERVER_ERROR are not
// retried by Close: the member is out of its generation, or the broker says
// nothing more.
func retriableCommit(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Retriable
	}
	return true
}

// frontierEpoch returns the leader epoch to commit off with: that of the
// record at off when it is unfinished, else that of the highest record seen
// (p.mu held).
func (p *partition) frontierEpoch(off int64) (int64, int32, bool) {
	p.trim()
	if p.head < len(p.queue) && p.queue[p.head].off == off {
		return off, p.queue[p.head].epoch, true
	}
	if p.fetched && off == p.highest+1 {
		return off, p.highestEpoch, true
	}
	return off, -1, true
}

// readBack is confirmCommitted given up to a second of ctx: Close and
// revoke read back what the broker refused before saying it is not
// committed.
func (c *Consumer) readBack(ctx context.Context, failed []UncommittedPartition) []UncommittedPartition {
	if len(failed) == 0 {
		return failed
	}
	rctx, cancel := context.WithTimeout(ctx, readBackTimeout)
	defer cancel()
	return c.confirmCommitted(rctx, failed)
}

// readBackTimeout bounds readBack.
const readBackTimeout = time.Second

// confirmCommitted reads the group's committed offsets of failed back from
// the broker and returns those not on it, each with the offset the broker
// holds as Committed. A commit can be applied though its answer says
// otherwise (REQUEST_TIMED_OUT, a connection cut after the request was
// sent): such a frontier is committed, and the next owner starts there.
// When the read fails, failed is returned unchanged.
func (c *Consumer) confirmCommitted(ctx context.Context, failed []UncommittedPartition) []UncommittedPartition {
	if len(failed) == 0 || ctx.Err() != nil {
		return failed
	}
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = c.group
	idx := map[string]int{}
	for _, f := range failed {
		i, ok := idx[f.Topic]
		if !ok {
			i = len(req.Topics)
			idx[f.Topic] = i
			rt := kmsg.NewOffsetFetchRequestTopic()
			rt.Topic = f.Topic
			req.Topics = append(req.Topics, rt)
		}
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, f.Partition)
	}
	resp, err := req.RequestWith(ctx, c.cl)
	if err != nil || kerr.ErrorForCode(resp.ErrorCode) != nil {
		return failed
	}
	onBroker := map[tp]int64{}
	read := func(topic string, pp kmsg.OffsetFetchResponseTopicPartition) {
		if kerr.ErrorForCode(pp.ErrorCode) == nil {
			onBroker[tp{topic, pp.Partition}] = pp.Offset
		}
	}
	for _, t := range resp.Topics {
		for _, pp := range t.Partitions {
			read(t.Topic, pp)
		}
	}
	for _, g := range resp.Groups {
		if kerr.ErrorForCode(g.ErrorCode) != nil {
			continue
		}
		for _, t := range g.Topics {
			for _, pp := range t.Partitions {
				read(t.Topic, kmsg.OffsetFetchResponseTopicPartition{Partition: pp.Partition, Offset: pp.Offset, ErrorCode: pp.ErrorCode})
			}
		}
	}
	out := failed[:0]
	for _, f := range failed {
		off, ok := onBroker[tp{f.Topic, f.Partition}]
		if ok && off == f.Offset {
			continue
		}
		if ok {
			f.Committed = off
		}
		out = append(out, f)
	}
	return out
}
