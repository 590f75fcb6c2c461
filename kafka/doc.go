// Package kafka consumes Kafka topics with key-level parallelism inside each
// partition: a franz-go group consumer feeds a keysched scheduler, so that
// records with the same (topic, partition, key) are handled one at a time in
// offset order while different keys of one partition run concurrently on a
// shared, bounded pool of workers. A slow record stalls its key, not its
// partition.
//
// # Guarantees
//
// Delivery is at-least-once: a record may be handled more than once (after a
// crash, a lost partition, a revoke that timed out, or a retry), so handlers
// must be idempotent.
//
//   - Order (KeyOrder, the default): records of one key are handled one at a
//     time in offset order; every attempt of a record, and its dead letter,
//     ends before the key's next record starts. Records with a nil key share
//     one chain per partition; the same key bytes in two topics are two keys.
//     PartitionOrder orders whole partitions; Unordered orders nothing.
//   - Commit frontier: per partition the consumer commits the offset of the
//     lowest record fetched and not finished (one past the highest fetched
//     when all are finished), with that record's leader epoch. Offsets that
//     never arrive (compaction, transaction markers) do not hold it back. A
//     commit never passes unfinished work, and commits of a partition never
//     go down within an assignment.
//   - Finished means the handler returned nil, or the record's dead letter
//     was acknowledged by the broker (a synchronous produce). A record whose
//     handler was interrupted (revoke timeout, a loss, Close gave up) is not
//     finished: neither committed nor dead-lettered; the next owner handles
//     it.
//   - Ownership: every assignment of a partition is a new epoch. Work is
//     stamped with it; results of an earlier assignment are dropped, and no
//     commit is sent for a partition after its revoke or loss (the broker
//     does not check this).
//   - Fewer duplicates than the frontier alone: the offsets finished above the
//     frontier travel in the commit's metadata (runs, at most
//     WithCommitMetadataLimit bytes, default 4 KiB); a new owner skips them.
//     When the list does not fit, the longest prefix that fits is written
//     (the runs nearest the frontier); when the broker refuses it
//     (OFFSET_METADATA_TOO_LARGE), the frontier is committed alone. The log
//     says so in both cases.
//   - Backpressure in bounded memory: the poll loop never blocks on a key. A
//     record that finds its key or the scheduler full is held back, and a
//     partition with held records is paused (fetching stops for it alone).
//     A partition with WithMaxInFlight records unfinished (held ones
//     included) is not polled: the poll loop waits for it to fall below
//     the bound, and pauses it when it finishes no record for 10 ms or is
//     still at the bound after 100 ms, or 100 ms after the first of a run
//     of polls each of which left it at the bound while other partitions'
//     fetched records may wait behind its own (a pause makes franz-go drop the
//     partition's buffered records and fetch them again later). A paused
//     partition resumes once an eighth of the bound is free. Heartbeats and
//     rebalances go on while a key is stuck; memory is bounded by partitions
//     x WithMaxInFlight plus one poll (WithMaxPollRecords). Records that stay
//     unfinished long are copied out of their fetch's buffer, so that a
//     stuck key does not keep whole fetch responses reachable.
//
// # Groups
//
// The records of one key (of one partition under PartitionOrder) that
// arrive in one poll form one scheduler task, handled one after another in
// offset order. This keeps the adapter's cost per record low; offsets are
// still tracked record by record,
// and retries stay per record (a record that fails after an earlier one of
// its group failed is handed on, with the rest, to a task of its own). The
// scheduler's Stats count groups; the consumer's own Stats count records
// (Fetched, Succeeded, FailedAttempts, Finished, DeadLettered). With keysched.WithTaskTimeout every record
// is a task of its own, so that each gets the whole timeout.
//
// # Failures
//
// A handler's error or panic is a failed attempt, retried by the scheduler's
// retry policy (keysched.WithRetry through WithSchedulerOptions; panics are
// retried too, the consumer adds keysched.WithRetryPanics). An error made
// with keysched.Snooze is not an attempt: the record runs again after its
// delay, holding its key, without spending the budget, and neither
// HeaderAttempts nor ParkedKey.Attempts counts it. When the attempts
// are spent (or the error is keysched.Permanent) the record is produced to
// the dead-letter topic (WithDeadLetterTopic) and finished once the broker
// acknowledges it; a failing produce is retried while the key waits, and the
// record stays unfinished until it succeeds or the partition is taken away.
// Without a dead-letter topic the record is logged at Error and counted
// finished. Run checks at its start that the cluster has the dead-letter
// topic (unless kgo.AllowAutoTopicCreation is among the client options) and
// returns an error wrapping ErrUnknownTopic when it still does not after
// about a second (a topic created just before Run may take that long to
// reach every broker's metadata). Under keysched.Park the key stops on the
// failed record instead
// (Parked lists it; Resume runs it again; Skip dead-letters it and moves
// on), holding its partition's frontier and, at the bound, its fetching.
//
// Dead letters carry the original key, value and headers, then these
// headers, in Kafka Connect's convention (the __connect.errors.* names, values
// as UTF-8 decimal strings), extended in the same namespace with
// timestamp, consumer group and attempts: HeaderTopic, HeaderPartition,
// HeaderOffset, HeaderTimestamp (Unix ms), HeaderConsumerGroup,
// HeaderAttempts, HeaderExceptionClass (the error's Go type),
// HeaderMessage, and HeaderStacktrace for a panic (the message and the
// stack cut to MaxHeaderMessageBytes and MaxHeaderStacktraceBytes, so that
// a huge error cannot make its dead letter too large to produce).
//
// Replay (and the command kafka/cmd/kafkareplay) republishes chosen dead
// letters to their original partition, on purpose: filtered, validated
// before anything is written, in their first-produced order, with the
// replay headers (HeaderReplayCount ...) and up to a replay limit.
// ParseDeadLetter reads a dead letter's headers.
//
// # Rebalances
//
// The client runs with kgo.BlockRebalanceOnPoll (rebalances wait until the
// poll loop has dispatched a poll's records, never until they are handled)
// and the cooperative-sticky balancer unless the caller picks another. On a
// revoke the consumer stops dispatching the partition, waits up to
// WithRevokeTimeout for its running handlers, interrupts the rest (their
// contexts are cancelled), commits its frontier synchronously, drops its
// queued and held records (neither success nor dead letter: the next owner
// handles them), forgets its parked keys and clears its pause. A loss does the
// same without the wait and the commit: another member may own the partitions
// already, so their running handlers are cancelled at once. A revoke's commit is bounded by the revoke
// timeout; one the broker refused is read back from the group's offsets
// within that bound, and one not on the broker is logged once. Close stops fetching, drains until
// its context ends (or until only parked keys' records are left: Resume and
// Skip refuse once Close has started), interrupts what is left, commits (retrying retriable
// refusals, up to a second past its context), and leaves the group; it
// returns within its context plus CloseMargin whatever the revoke timeout
// and whatever the brokers do, and its error says what it could not do:
// records left unfinished, and frontiers not committed (ErrNotCommitted, a
// *CommitError per partition with the broker's error).
//
// # Broker faults
//
// Every request can fail, for a while or for good: offset commits, fetches,
// heartbeats and joins, dead-letter produces; leaders and the coordinator
// move; brokers go and come back. franz-go retries; the consumer keeps its
// promises meanwhile (order, a frontier that never passes unfinished work,
// bounded memory) and logs one line per fault class and state change
// (failing, still failing after 10, 100, 1000... tries, recovered). The
// README's fault table lists each fault, what the consumer does, what the
// caller sees and the test that holds it.
//
// # Options and defaults
//
//	WithClientOptions        franz-go options: seeds, kgo.ConsumerGroup and
//	                         kgo.ConsumeTopics (required), TLS, timeouts...
//	WithSchedulerOptions     keysched options: workers (default 64), retry,
//	                         task timeout, failure policy, bounds
//	WithOrdering             KeyOrder (default), PartitionOrder, Unordered
//	WithMaxInFlight          records per partition fetched and not finished (4096)
//	WithCommitInterval       time between commits (5 s)
//	WithRevokeTimeout        wait for running handlers on revoke (10 s; a loss does not wait)
//	WithDeadLetterTopic      where failed records go (none: logged)
//	WithCommitMetadataLimit  bytes of finished-offset metadata per commit (4096; 0 off)
//	WithMaxPollRecords       records per poll (10000)
//	WithLogger               slog logger (slog.Default())
//	WithMeterProvider        OpenTelemetry metrics (none; see Metrics)
//
// A resumed partition is fetched again only after the broker answers the
// fetch in flight, which can take up to kgo.FetchMaxWait (franz-go's default
// is 5 s) when the other partitions have no new data: with pauses likely,
// set a lower FetchMaxWait (the tests and kafkabench use 10-50 ms).
//
// # Metrics
//
// WithMeterProvider reports these instruments. They follow the OpenTelemetry semantic conventions for messaging, version
// 1.43.0 (the semconv package of go.opentelemetry.io/otel v1.46.0):
//
//	messaging.client.consumed.messages  Counter {message}  records handed to the scheduler (after the ones an earlier owner's commit metadata marks finished)
//	messaging.process.duration          Histogram s        one handler run, error.type=_OTHER when it returned an error (a keysched.Snooze too, though it is not an attempt)
//
// with messaging.system=kafka, messaging.operation.name (poll, process),
// messaging.destination.name (the topic), messaging.destination.partition.id
// (the partition, as a string) and messaging.consumer.group.name. Per owned
// partition, read from Stats at collection time (asynchronous gauges), with
// the same attributes, the conventions having none of these:
//
//	keysched.kafka.partition.lag               Gauge {message}  Lag: high watermark minus the committed offset
//	keysched.kafka.partition.committed_offset  Gauge {offset}   Committed (absent until something is committed)
//	keysched.kafka.partition.frontier          Gauge {offset}   Frontier: what a commit now would write
//	keysched.kafka.partition.in_flight         UpDownCounter {message}  InFlight: fetched, not finished
//	keysched.kafka.partition.held              UpDownCounter {message}  Held: of those, held back by the poll loop
//	keysched.kafka.partition.paused            Gauge {partition}  1 while fetching is paused (backpressure), else 0
//
// A partition's series exist while this member owns it: once it is revoked
// or lost, they are gone from the next collection (no stale lag series for a
// partition another member now owns). The consumer's scheduler reports
// otelkeysched's instruments (keysched.tasks.pending and the rest) with
// messaging.consumer.group.name. No record key is ever an attribute value.
//
// See README.md for the benchmark (kafka/cmd/kafkabench) and its figures.
package kafka
