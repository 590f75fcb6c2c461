package kafka

import (
	"slices"

	"github.com/keysched/keysched"
)

// PartitionStats describes one partition this member owns now.
type PartitionStats struct {
	Topic     string
	Partition int32
	// Epoch numbers this assignment of the partition to the member (it
	// grows with every assignment).
	Epoch uint64
	// Committed is the last offset committed for the partition (by this
	// member, or read back when it was assigned); -1 if none.
	Committed int64
	// Frontier is the offset a commit now would write: the lowest record
	// fetched and not finished, or one past the highest fetched; Committed
	// when nothing was fetched yet.
	Frontier int64
	// HighestFetched is the offset of the highest record fetched; -1 if
	// none in this assignment.
	HighestFetched int64
	// HighWatermark is the partition's high watermark at the last fetch;
	// -1 if unknown.
	HighWatermark int64
	// InFlight counts records fetched and not finished (bounded by
	// WithMaxInFlight), Held those of them the poll loop holds back.
	InFlight int
	Held     int
	// Paused reports whether fetching is paused for the partition.
	Paused bool
	// Lag is HighWatermark minus Committed (minus Frontier when nothing
	// is committed): the records a new owner would still have to handle.
	// 0 when the high watermark is unknown.
	Lag int64
}

// Stats is a snapshot of a consumer. Counters count since NewConsumer.
// Every figure counts records (the unit of WithMaxInFlight), except
// Commits and CommitErrors (partition offsets) and Scheduler, the
// scheduler's own snapshot, whose tasks are groups of records.
type Stats struct {
	// Group is the consumer group's name.
	Group string
	// Partitions holds the partitions owned now, by topic then
	// partition; a revoked or lost partition is absent.
	Partitions []PartitionStats
	// Fetched counts records fetched and given to the scheduler (a record
	// fetched again after a loss or a rebalance counts again; those
	// skipped by commit metadata do not).
	Fetched uint64
	// Succeeded counts records whose handler returned nil; FailedAttempts
	// handler calls that returned an error or panicked (a record retried
	// twice that then succeeds counts 2 here and 1 in Succeeded; a
	// keysched.Snooze is not counted).
	Succeeded, FailedAttempts uint64
	// InFlight and Held sum the owned partitions' InFlight and Held.
	InFlight, Held int
	// Finished counts records finished (handled, or dead-lettered);
	// DeadLettered counts dead letters written (or logged, without a
	// dead-letter topic); SkippedByMetadata counts records not handled
	// because an earlier owner's commit metadata said they were finished.
	Finished, DeadLettered, SkippedByMetadata uint64
	// Commits counts partition offsets committed, CommitErrors commits
	// (or partitions of one) that failed.
	Commits, CommitErrors uint64
	// Scheduler is the scheduler's own snapshot. Its tasks are groups
	// (the records of one key, or of one partition under PartitionOrder,
	// from one poll), not records: its Submitted, Succeeded, Failed,
	// Retried... count groups and group attempts. Count records with
	// Fetched, Succeeded, FailedAttempts, Finished and DeadLettered.
	Scheduler keysched.Stats
}

// Stats returns a snapshot. It is cheap (a short lock per owned partition,
// no request to the brokers) and safe to call concurrently with everything.
func (c *Consumer) Stats() Stats {
	if c.zero() {
		return Stats{}
	}
	st := Stats{
		Group:             c.group,
		Finished:          c.finished.Load(),
		DeadLettered:      c.deadLettered.Load(),
		SkippedByMetadata: c.skippedMeta.Load(),
		Commits:           c.commits.Load(),
		Fetched:           c.fetched.Load(),
		Succeeded:         c.succeeded.Load(),
		FailedAttempts:    c.failedAttempts.Load(),
		CommitErrors:      c.commitErrs.Load(),
		Scheduler:         c.sched.Stats(),
	}
	for _, p := range c.owned() {
		p.mu.Lock()
		ps := PartitionStats{
			Topic: p.topic, Partition: p.id, Epoch: p.epoch,
			Committed: p.committed, HighestFetched: -1, HighWatermark: p.hwm,
			InFlight: int(p.inflight.Load()), Held: p.heldRecords(), Paused: p.paused.Load(),
		}
		if p.fetched {
			ps.HighestFetched = p.highest
		}
		if f, _, ok := p.frontier(); ok {
			ps.Frontier = f
		} else {
			ps.Frontier = max(p.committed, 0)
		}
		p.mu.Unlock()
		if ps.HighWatermark >= 0 {
			base := ps.Committed
			if base < 0 {
				base = ps.Frontier
			}
			ps.Lag = max(ps.HighWatermark-base, 0)
		}
		st.Partitions = append(st.Partitions, ps)
		st.InFlight += ps.InFlight
		st.Held += ps.Held
	}
	slices.SortFunc(st.Partitions, func(a, b PartitionStats) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		return int(a.Partition - b.Partition)
	})
	return st
}
