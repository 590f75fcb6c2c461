package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keysched/keysched"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A Handler handles one record. It runs on a worker of the consumer's
// scheduler, never concurrently with another record of its key (see
// Ordering). Returning nil finishes the record; an error (or a panic) is a
// failed attempt, retried by the scheduler's retry policy and, when the
// attempts are spent, dead-lettered. ctx carries the values of Run's context
// and is cancelled when the record's partition is taken away after the revoke
// timeout, when Close gives up, or at the scheduler's task timeout. A handler
// may run more than once for one record (at-least-once delivery): make it
// idempotent. It must not keep r after returning.
type Handler func(ctx context.Context, r *kgo.Record) error

// schedKey is a chain of the scheduler: (topic, partition, key) under
// KeyOrder, (topic, partition) under PartitionOrder, a record of its own
// under Unordered.
type schedKey struct {
	topic string
	part  int32
	null  bool   // a nil record key
	key   string // the record key's bytes
	off   int64  // Unordered: the record's offset; else -1
}

type tp struct {
	topic string
	part  int32
}

// A Consumer consumes the topics of one consumer group with franz-go and runs
// each record's Handler on a keysched scheduler: records of one key in
// offset order, different keys of one partition concurrently. It commits,
// per partition, the commit frontier: the offset of the lowest record fetched
// and not finished (or one past the highest fetched when all are finished),
// so a commit never passes unfinished work; delivery is at-least-once.
//
// All methods are safe for concurrent use. Call Run once, and Close to end.
//
// The zero Consumer is not usable: use NewConsumer. The methods of a nil or
// zero Consumer return ErrZeroConsumer (those with an error result) or zero
// values, and do nothing else.
type Consumer struct {
	cfg    config
	h      Handler
	cl     *kgo.Client
	sched  *keysched.Scheduler[schedKey]
	group  string
	log    *slog.Logger
	dlqSet bool

	mu    sync.Mutex // guards parts
	parts map[tp]*partition
	epoch atomic.Uint64

	commitMu sync.Mutex // one commit at a time; revoke and loss take it too
	metaMax  atomic.Int64

	parkMu sync.Mutex
	parked map[schedKey]*item

	// perRecord: the scheduler gives each attempt a deadline
	// (keysched.WithTaskTimeout), so every record is a task of its own (a
	// group's records would share one attempt's deadline).
	perRecord bool

	intervalCommitTimeout time.Duration                      // see intervalCommitTimeout
	intervalCancel        atomic.Pointer[context.CancelFunc] // ends the interval commit in flight
	revoking              atomic.Int32                       // revokes waiting for or holding commitMu

	failMu  sync.Mutex
	failing map[schedKey]*group // see Consumer.fail

	heldParts  atomic.Int64 // partitions paused by this consumer
	holding    atomic.Int64 // partitions with held records
	wakeReq    atomic.Bool
	pollCancel atomic.Pointer[context.CancelFunc]
	revokeWake chan struct{}

	runCtx    context.Context // values for handlers; set by Run
	running   atomic.Bool
	runDone   chan struct{}
	closing   atomic.Bool
	stop      chan struct{}   // closed when Close starts
	give      context.Context // ends when Close's context ended
	giveUp    func()
	closeMu   sync.Mutex
	closed    bool
	closeErr  error          // set before closeDone is closed
	closeDone chan struct{}  // closed when the first Close returns
	bg        sync.WaitGroup // the committer
	bgCtx     context.Context
	bgCancel  context.CancelFunc // ends the committer's commit in flight when Close starts

	commitLog, fetchLog, dlqLog *faultLog // one log line per state change of each fault class

	finished       atomic.Uint64
	fetched        atomic.Uint64 // records (see Stats)
	succeeded      atomic.Uint64
	failedAttempts atomic.Uint64
	deadLettered   atomic.Uint64
	skippedMeta    atomic.Uint64
	commits        atomic.Uint64
	commitErrs     atomic.Uint64

	metrics *consumerMetrics // WithMeterProvider (metrics.go); nil without
}

// NewConsumer returns a consumer that runs h for every record. It creates the
// franz-go client (which starts joining the group) and the scheduler; call
// Close to release both. It fails with ErrNilHandler for a nil h, and with an
// error wrapping ErrInvalidOption for a bad option, a client option franz-go
// refuses, or a missing consumer group or topic.
func NewConsumer(h Handler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, ErrNilHandler
	}
	cfg := defaultConfig()
	for i, o := range opts {
		if o == nil {
			return nil, optionError("option %d is nil", i)
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	c := &Consumer{
		cfg:        cfg,
		h:          h,
		log:        cfg.logger,
		parts:      make(map[tp]*partition),
		parked:     make(map[schedKey]*item),
		failing:    make(map[schedKey]*group),
		revokeWake: make(chan struct{}, 1),
		runCtx:     context.Background(),
		runDone:    make(chan struct{}),
		closeDone:  make(chan struct{}),
		stop:       make(chan struct{}),
		dlqSet:     cfg.dlqTopic != "",
		commitLog:  newFaultLog(cfg.logger, "offset commit"),
		fetchLog:   newFaultLog(cfg.logger, "fetch"),
		dlqLog:     newFaultLog(cfg.logger, "dead-letter produce"),
	}
	c.bgCtx, c.bgCancel = context.WithCancel(context.Background())
	c.give, c.giveUp = context.WithCancel(context.Background())
	c.metaMax.Store(int64(cfg.metaMax))
	// A key never holds more than its partition's in-flight bound: with that
	// key depth, the partition's bound (not the key's) pauses fetching.
	// The consumer's own dead-letter function and observer come before the
	// caller's options: the scheduler's key type is the adapter's unexported
	// schedKey, so a keysched.WithDeadLetter or keysched.WithObserver given
	// with WithSchedulerOptions can never match it and New refuses it, where
	// after them it would be replaced silently.
	sopts := []keysched.Option{keysched.WithRetryPanics(), keysched.WithLogger(cfg.logger),
		keysched.WithMaxKeyDepth(cfg.maxInFlight), keysched.WithDeadLetter(c.deadLetter)}
	if cfg.meterProvider != nil {
		obs, err := c.newMetrics() // metrics.go
		if err != nil {
			return nil, err
		}
		sopts = append(sopts, obs)
	}
	sopts = append(sopts, cfg.schedOpts...)
	s, err := keysched.New[schedKey](sopts...)
	if err != nil {
		if oe := (*keysched.OptionError)(nil); errors.As(err, &oe) && (oe.Option == "WithDeadLetter" || oe.Option == "WithObserver") {
			return nil, fmt.Errorf("%w: WithSchedulerOptions: the consumer sets keysched.WithDeadLetter and keysched.WithObserver itself (use WithDeadLetterTopic and WithMeterProvider): %w", ErrInvalidOption, err)
		}
		return nil, fmt.Errorf("%w: scheduler: %w", ErrInvalidOption, err)
	}
	c.sched = s
	if c.perRecord, err = hasTaskTimeout(s); err != nil {
		_ = s.Close(context.Background())
		return nil, fmt.Errorf("kafka: scheduler: %w", err)
	}
	copts := append([]kgo.Opt{}, cfg.clientOpts...)
	copts = append(copts,
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(c.onAssigned),
		kgo.OnPartitionsRevoked(c.onRevoked),
		kgo.OnPartitionsLost(c.onLost),
		kgo.OnOffsetsFetched(c.onOffsetsFetched),
	)
	cl, err := kgo.NewClient(copts...)
	if err != nil {
		_ = s.Close(context.Background())
		// franz-go's own words for a missing group ("invalid autocommit
		// options specified when a group was not specified") do not say
		// what the adapter needs: say it too.
		return nil, fmt.Errorf("%w: WithClientOptions: the adapter needs kgo.ConsumerGroup and kgo.ConsumeTopics (or kgo.ConsumeRegex); franz-go says: %w", ErrInvalidOption, err)
	}
	group, _ := cl.OptValue(kgo.ConsumerGroup).(string)
	if group == "" || len(cl.GetConsumeTopics()) == 0 && !isRegex(cl) {
		cl.Close()
		_ = s.Close(context.Background())
		return nil, optionError("WithClientOptions: need kgo.ConsumerGroup and kgo.ConsumeTopics (or kgo.ConsumeRegex)")
	}
	c.cl, c.group = cl, group
	c.intervalCommitTimeout = intervalCommitTimeout(cl)
	if c.metrics != nil {
		if err := c.metrics.register(); err != nil {
			cl.Close()
			_ = s.Close(context.Background())
			return nil, err
		}
	}
	return c, nil
}

// hasTaskTimeout runs one probe task on s and reports whether its context
// had a deadline: whether s was made with keysched.WithTaskTimeout. When the
// probe does not run within 5 s (a shared pool kept busy), it says yes:
// one task per record is right either way, only slower.
func hasTaskTimeout(s *keysched.Scheduler[schedKey]) (bool, error) {
	var has atomic.Bool
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	comp, err := s.Submit(ctx, schedKey{off: -2}, func(ctx context.Context) error {
		_, ok := ctx.Deadline()
		has.Store(ok)
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return true, nil // no room within 5 s
		}
		return false, err
	}
	if err := comp.Wait(ctx); err != nil {
		comp.Cancel()
		return true, nil
	}
	return has.Load(), nil
}

// intervalCommitTimeout bounds an interval commit (franz-go's retries of a
// refused one included): 30 s, or a quarter of the group's rebalance
// timeout when that is less (at least 100 ms). franz-go does not rejoin the
// group while a commit is in flight, so a commit a failing broker keeps
// refusing would otherwise hold the member's rejoin past the rebalance
// timeout, and the group would drop it.
func intervalCommitTimeout(cl *kgo.Client) time.Duration {
	d := 30 * time.Second
	if rt, ok := cl.OptValue(kgo.RebalanceTimeout).(time.Duration); ok && rt > 0 {
		d = min(d, max(rt/4, 100*time.Millisecond))
	}
	return d
}

func isRegex(cl *kgo.Client) bool {
	b, _ := cl.OptValue(kgo.ConsumeRegex).(bool)
	return b
}

// Client returns the franz-go client, for what the consumer does not wrap
// (admin requests, producing). Do not poll, commit, pause or close it.
func (c *Consumer) Client() *kgo.Client {
	if c.zero() {
		return nil
	}
	return c.cl
}

// Group returns the consumer group's name.
func (c *Consumer) Group() string {
	if c.zero() {
		return ""
	}
	return c.group
}

// zero reports a nil Consumer or one not made by NewConsumer.
func (c *Consumer) zero() bool { return c == nil || c.sched == nil }

// Run fetches records and dispatches them to the scheduler until ctx ends or
// Close is called. It returns nil after Close, an error wrapping ctx's error
// when ctx ended (call Close then: it drains, commits and leaves the group),
// ErrRunning if Run was called before, ErrClosed if Close has started,
// ErrZeroConsumer for a Consumer not made by NewConsumer. The
// handlers' contexts carry ctx's values, not its cancellation.
//
// Run never blocks on a key: a record that finds its key (or the scheduler)
// full is held back, and its partition paused until room appears;
// heartbeats and rebalances go on meanwhile.
func (c *Consumer) Run(ctx context.Context) error {
	if c.zero() {
		return ErrZeroConsumer
	}
	if ctx == nil {
		return ErrNilContext
	}
	c.closeMu.Lock() // Close sets closed under it: Run starts before it or not at all
	if c.closed {
		c.closeMu.Unlock()
		return ErrClosed
	}
	if !c.running.CompareAndSwap(false, true) {
		c.closeMu.Unlock()
		return ErrRunning
	}
	c.runCtx = context.WithoutCancel(ctx)
	c.bg.Add(1)
	go c.committer()
	c.closeMu.Unlock()
	defer close(c.runDone)
	var backoff time.Duration // after polls that brought only fetch errors
	for {
		if c.closing.Load() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("kafka: run: %w", err)
		}
		c.wakeReq.Store(false)
		c.dispatchHeld()
		pctx, cancel := context.WithCancel(ctx)
		c.pollCancel.Store(&cancel)
		if c.wakeReq.Load() || c.closing.Load() {
			cancel()
		}
		fetches := c.cl.PollRecords(pctx, c.cfg.maxPoll)
		c.pollCancel.Store(nil)
		cancel()
		if fetches.IsClientClosed() {
			c.cl.AllowRebalance()
			return nil
		}
		failed, cancelled := false, false
		fetches.EachError(func(t string, p int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				cancelled = true
				return
			}
			failed = true
			c.fetchLog.fail(err, "topic", t, "partition", p)
		})
		if !failed && !cancelled {
			c.fetchLog.ok()
		}
		fetches.EachPartition(c.route)
		c.cl.AllowRebalance()
		// franz-go hands some refused fetches (UNKNOWN_SERVER_ERROR) to
		// the poll at once and fetches again when polled: without a pause
		// the loop would spin, thousands of requests a second.
		if failed && fetches.NumRecords() == 0 {
			backoff = min(max(2*backoff, 10*time.Millisecond), 250*time.Millisecond)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-c.stop:
			case <-ctx.Done():
			}
			t.Stop()
		} else if !failed {
			backoff = 0
		}
	}
}

// wake makes the poll loop look at held records and paused partitions.
func (c *Consumer) wake() {
	if c.wakeReq.Swap(true) {
		return // already asked: one wake-up per poll
	}
	if f := c.pollCancel.Load(); f != nil {
		(*f)()
	}
}

func (c *Consumer) lookup(topic string, part int32) *partition {
	c.mu.Lock()
	p := c.parts[tp{topic, part}]
	c.mu.Unlock()
	return p
}

func (c *Consumer) owned() []*partition {
	c.mu.Lock()
	ps := make([]*partition, 0, len(c.parts))
	for _, p := range c.parts {
		ps = append(ps, p)
	}
	c.mu.Unlock()
	return ps
}

func (c *Consumer) keyOf(r *kgo.Record) schedKey {
	switch c.cfg.ordering {
	case PartitionOrder:
		return schedKey{topic: r.Topic, part: r.Partition, off: -1}
	case Unordered:
		return schedKey{topic: r.Topic, part: r.Partition, off: r.Offset}
	}
	return schedKey{topic: r.Topic, part: r.Partition, null: r.Key == nil, key: string(r.Key), off: -1}
}

// route takes one partition's records from a poll: each record is tracked,
// and put into its chain's group for this poll; the groups are submitted, or
// held when the scheduler has no room.
func (c *Consumer) route(fp kgo.FetchTopicPartition) {
	p := c.lookup(fp.Topic, fp.Partition)
	if p == nil || !p.active() {
		return // not ours (any more): the owner fetches them
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.active() {
		return
	}
	p.hwm = fp.HighWatermark
	p.polls++
	groups := p.scratch[:0]
	consumed := 0
	if c.metrics != nil {
		defer func() { c.metrics.consumedN(fp.Topic, fp.Partition, consumed) }()
	}
	for _, r := range fp.Records {
		if p.fetched && r.Offset <= p.highest {
			continue // fetched again: already tracked
		}
		if len(p.skip) > 0 && p.skipped(r.Offset) {
			p.seen(r)
			c.skippedMeta.Add(1)
			continue
		}
		p.seen(r)
		consumed++
		it := newItem(p, r)
		p.add(it)
		groups = c.addTo(p, groups, it, r)
	}
	for _, g := range groups {
		if len(p.held) > 0 || !c.dispatch(g) {
			p.held = append(p.held, g)
		}
	}
	clear(groups)
	p.scratch = groups[:0]
	c.fetched.Add(uint64(consumed))
	p.sweepLast()
	c.adjustPause(p)
}

// dispatch submits g without waiting; false when its key or the scheduler
// is full (or closing).
func (c *Consumer) dispatch(g *group) bool {
	comp, err := c.sched.TrySubmit(g, g.key, runGroup)
	if err != nil {
		c.submitError(g, err)
		return false
	}
	g.comp.Store(comp)
	return true
}

func (c *Consumer) submitError(g *group, err error) {
	if !errors.Is(err, keysched.ErrKeyFull) && !errors.Is(err, keysched.ErrFull) && !errors.Is(err, keysched.ErrClosed) {
		c.log.Error("kafka: cannot submit records", "topic", g.p.topic, "partition", g.p.id, "records", len(g.items), "err", err)
	}
}

// dispatchHeld retries the held groups of every owned partition, in order
// per key: a key whose group stays held keeps its later groups held too;
// other keys go on.
func (c *Consumer) dispatchHeld() {
	for _, p := range c.owned() {
		if !p.paused.Load() {
			continue
		}
		p.mu.Lock()
		if p.active() && len(p.held) > 0 && !c.closing.Load() {
			var blocked map[schedKey]struct{}
			kept := p.held[:0]
			full := false
			for _, g := range p.held {
				if !full {
					if _, b := blocked[g.key]; !b {
						if c.dispatch(g) {
							continue
						}
						if c.sched.KeyDepth(g.key) == 0 {
							full = true // the scheduler, not the key, is full
						}
						if blocked == nil {
							blocked = make(map[schedKey]struct{})
						}
						blocked[g.key] = struct{}{}
					}
				}
				kept = append(kept, g)
			}
			clear(p.held[len(kept):])
			p.held = kept
		}
		c.adjustPause(p)
		p.mu.Unlock()
	}
}

// resumeAt is the in-flight count at which a paused partition resumes: an
// eighth of the bound free (at least one record). Not half: a stuck key
// holding more than the resume point would keep its partition paused while
// other keys could go on; with an eighth, only a key holding nearly the
// whole bound does.
func resumeAt(bound int) int64 { return int64(bound - max(1, bound/8)) }

// adjustPause pauses p at its in-flight bound or with held records, and
// resumes it once an eighth of the bound is free with nothing held (p.mu
// held).
func (c *Consumer) adjustPause(p *partition) {
	if h := len(p.held) > 0; h != p.holding {
		p.holding = h
		if h {
			c.holding.Add(1)
		} else {
			c.holding.Add(-1)
		}
	}
	if !p.active() {
		return
	}
	n := p.inflight.Load()
	max := int64(c.cfg.maxInFlight)
	switch {
	case !p.paused.Load() && (n >= max || len(p.held) > 0):
		p.paused.Store(true)
		c.heldParts.Add(1)
		c.cl.PauseFetchPartitions(map[string][]int32{p.topic: {p.id}})
	case p.paused.Load() && len(p.held) == 0 && n <= resumeAt(c.cfg.maxInFlight):
		p.paused.Store(false)
		c.heldParts.Add(-1)
		c.cl.ResumeFetchPartitions(map[string][]int32{p.topic: {p.id}})
	}
}

// onAssigned starts a new assignment (a new epoch) for each partition.
func (c *Consumer) onAssigned(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, ps := range m {
		for _, id := range ps {
			k := tp{t, id}
			if old := c.parts[k]; old != nil {
				old.state.Store(stGone)
				old.cancel()
			}
			c.parts[k] = newPartition(c, t, id, c.epoch.Add(1))
		}
	}
}

func (c *Consumer) take(m map[string][]int32) []*partition {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ps []*partition
	for t, ids := range m {
		for _, id := range ids {
			if p := c.parts[tp{t, id}]; p != nil {
				ps = append(ps, p)
			}
		}
	}
	return ps
}

func (c *Consumer) onRevoked(ctx context.Context, _ *kgo.Client, m map[string][]int32) {
	c.revoke(ctx, c.take(m), true)
}

func (c *Consumer) onLost(ctx context.Context, _ *kgo.Client, m map[string][]int32) {
	c.revoke(ctx, c.take(m), false)
}

// revoke ends the assignments ps: stop dispatching, wait (up to the revoke
// timeout) for running handlers, interrupt what still runs, commit the
// frontiers (unless lost), drop queued and held records, clear pauses.
func (c *Consumer) revoke(ctx context.Context, ps []*partition, commit bool) {
	if len(ps) == 0 {
		return
	}
	for _, p := range ps {
		if !commit {
			p.noCommit.Store(true)
		}
		p.mu.Lock()
		p.state.CompareAndSwap(stActive, stRevoking)
		p.mu.Unlock()
	}
	c.waitRunning(ps, c.cfg.revokeTimeout)
	c.interrupt(ps)
	// End the interval commit in flight (see committer), so that commitMu
	// comes at once.
	c.revoking.Add(1)
	defer c.revoking.Add(-1)
	if f := c.intervalCancel.Load(); f != nil {
		(*f)()
	}
	c.commitMu.Lock()
	if commit {
		// Bounded by the revoke timeout and by Close giving up: a broker
		// that keeps refusing must not hold the rebalance (nor Close).
		cctx, cancel := context.WithTimeout(ctx, c.cfg.revokeTimeout)
		stop := context.AfterFunc(c.give, cancel)
		if failed := c.commitLocked(cctx, ps, "revoke"); len(failed) > 0 {
			c.log.Warn("kafka: revoke: frontiers not committed; the next owner handles their records again from the committed offset",
				"err", &CommitError{Partitions: failed})
		}
		stop()
		cancel()
	}
	c.unown(ps)
	c.commitMu.Unlock()
	c.forget(ps)
}

// unown removes ps from the owned set (c.commitMu held).
func (c *Consumer) unown(ps []*partition) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range ps {
		if c.parts[tp{p.topic, p.id}] == p {
			delete(c.parts, tp{p.topic, p.id})
		}
	}
}

// waitRunning waits until no handler of ps runs, d passes, or Close gives up.
func (c *Consumer) waitRunning(ps []*partition, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		busy := false
		for _, p := range ps {
			if p.running.Load() > 0 {
				busy = true
				break
			}
		}
		if !busy {
			return
		}
		select {
		case <-c.revokeWake:
		case <-t.C:
			return
		case <-c.give.Done():
			return
		}
	}
}

// interrupt stops the work of ps: the assignment's context ends (dead-letter
// produces stop), running handlers have their context cancelled, queued,
// waiting and parked records are withdrawn. None of them is finished.
func (c *Consumer) interrupt(ps []*partition) {
	for _, p := range ps {
		p.mu.Lock()
		p.state.Store(stGone)
		p.cancel()
		var last *group
		for _, it := range p.queue[p.head:] {
			if !it.done.Load() && it.g != nil && it.g != last {
				last = it.g
				if comp := last.comp.Load(); comp != nil {
					comp.Cancel()
				}
			}
		}
		p.mu.Unlock()
	}
}

// forget cleans up after ps left the owned set: held records are dropped,
// pauses cleared, parked keys forgotten.
func (c *Consumer) forget(ps []*partition) {
	resume := map[string][]int32{}
	for _, p := range ps {
		p.mu.Lock()
		clear(p.held)
		p.held = nil
		if p.holding {
			p.holding = false
			c.holding.Add(-1)
		}
		if p.paused.Swap(false) {
			c.heldParts.Add(-1)
		}
		resume[p.topic] = append(resume[p.topic], p.id)
		p.mu.Unlock()
	}
	c.cl.ResumeFetchPartitions(resume)
	c.parkMu.Lock()
	for k, it := range c.parked {
		if it.p.state.Load() == stGone {
			delete(c.parked, k)
		}
	}
	c.parkMu.Unlock()
	c.failMu.Lock()
	for k, g := range c.failing {
		if g.p.state.Load() == stGone {
			delete(c.failing, k)
		}
	}
	c.failMu.Unlock()
}

// committer commits the owned partitions' frontiers every commit interval
// until Close.
func (c *Consumer) committer() {
	defer c.bg.Done()
	t := time.NewTicker(c.cfg.commitInterval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			// Bounded, so that a broker that does not answer cannot hold
			// commitMu (and with it revokes) for ever, nor a rebalance:
			// franz-go does not join the group while a commit is in
			// flight, and a member that has not rejoined within the
			// rebalance timeout is dropped from the group.
			// Close ends it (bgCtx): it makes its own final commit.
			// A revoke ends it too, and none starts while one runs: the
			// revoke commits itself, and waiting for this commit (and
			// franz-go's retries of it) would hold the rebalance.
			ctx, cancel := context.WithTimeout(c.bgCtx, c.intervalCommitTimeout)
			c.intervalCancel.Store(&cancel)
			if c.revoking.Load() == 0 {
				c.commit(ctx, c.owned(), "interval")
			}
			c.intervalCancel.Store(nil)
			cancel()
		}
	}
}

// Close stops fetching, waits until the dispatched records are finished or
// ctx ends, interrupts what is left (those records are not finished: the
// next owner handles them), commits the frontiers, leaves the group, closes
// the client and the scheduler.
//
// It returns nil when everything dispatched finished and every frontier was
// committed. Otherwise its error says what it could not do, both when both
// happened (errors.Join): records left unfinished (an error wrapping ctx's
// error that says how many), and frontiers it could not commit (a
// *CommitError, matched by errors.Is(err, ErrNotCommitted), listing each
// partition with the broker's error). Before reporting them it reads the
// group's offsets back from the broker (within the time it has to leave the
// group): a frontier the broker holds after all (a commit applied though
// its answer said REQUEST_TIMED_OUT) is not reported, and each reported
// partition's Committed is the offset the broker holds (its last known
// one when the read fails). A commit the broker refuses with a
// retriable error (the coordinator moving or loading, a timeout) is sent
// again, 50 ms doubling to 1 s apart, until it succeeds or the commit's time
// ends; the final commit gets up to a second past ctx (with a ctx that
// never ends, Close waits for it as it waits for the records). Close returns within
// ctx plus CloseMargin whatever the brokers do (it never works through
// failed commits past that), Run returns nil, and later calls return the
// first one's result (a call made while the first one runs returns it too,
// or, when its own ctx ends first, an error wrapping ctx's error that says
// another Close is still running). When Close returns, the consumer's goroutines have
// ended, except handlers that ignore their context. Do not call it from a
// Handler.
func (c *Consumer) Close(ctx context.Context) error {
	if c.zero() {
		return ErrZeroConsumer
	}
	if ctx == nil {
		return ErrNilContext
	}
	c.closeMu.Lock()
	if c.closed {
		c.closeMu.Unlock()
		// Another Close runs (or ran): its result, or ctx's error when ctx
		// ends first, so that this call keeps its own bound.
		select {
		case <-c.closeDone:
			return c.closeErr
		case <-ctx.Done():
			select {
			case <-c.closeDone:
				return c.closeErr
			default:
			}
			return fmt.Errorf("kafka: close: another Close is still running: %w", ctx.Err())
		}
	}
	c.closed = true
	c.closeMu.Unlock() // Run checks closed under it: it starts before this or not at all
	defer close(c.closeDone)
	c.closing.Store(true)
	close(c.stop)
	c.bgCancel() // an interval commit in flight: the final commit below replaces it
	stopGiveUp := context.AfterFunc(ctx, c.giveUp)
	defer stopGiveUp()
	// The final commit's and leaving's bounds count from when ctx ends
	// (from now if it has ended), not from when each step starts: with an
	// ended ctx they would add up past CloseMargin.
	cctx, cancel := pastEnd(ctx, finalCommitGrace)
	defer cancel()
	lctx, lcancel := pastEnd(ctx, leaveGrace)
	defer lcancel()
	c.wake()
	if c.running.Load() {
		<-c.runDone
	}
	c.bg.Wait()

	var errs []error
	if derr := c.sched.Drain(ctx); derr != nil {
		n := 0
		for _, p := range c.owned() {
			n += int(p.inflight.Load())
		}
		errs = append(errs, fmt.Errorf("kafka: close: %d records unfinished (the next owner handles them): %w", n, ctx.Err()))
	}
	ps := c.owned()
	for _, p := range ps {
		p.state.CompareAndSwap(stActive, stRevoking)
	}
	c.interrupt(ps)
	// The final commit gets a second of its own past ctx (also when ctx
	// ended while draining).
	c.commitMu.Lock()
	failed := c.finalCommit(cctx, ps)
	c.unown(ps)
	c.commitMu.Unlock()
	cancel()
	if len(failed) > 0 {
		// What the broker refused may be on it all the same (an answer
		// that timed out): read it back, within leaving's time.
		rctx, rtimeout := context.WithTimeout(lctx, time.Second)
		failed = c.confirmCommitted(rctx, failed)
		rtimeout()
	}
	if len(failed) > 0 {
		slices.SortFunc(failed, func(a, b UncommittedPartition) int {
			if a.Topic != b.Topic {
				return strings.Compare(a.Topic, b.Topic)
			}
			return int(a.Partition - b.Partition)
		})
		errs = append(errs, &CommitError{Partitions: failed})
	}
	c.forget(ps)
	// Leaving the group is bounded too: a LeaveGroup (or a join in flight)
	// that the broker does not answer is given up, and the group drops
	// the member at its session timeout.
	c.cl.AllowRebalance()
	if err := c.cl.LeaveGroupContext(lctx); err != nil {
		c.log.Warn("kafka: close: leaving the group failed; the group reassigns this member's partitions at its session timeout", "err", err)
	}
	c.cl.CloseAllowingRebalance()
	lcancel()
	sctx, scancel := pastEnd(ctx, schedCloseGrace)
	if serr := c.sched.Close(sctx); serr != nil && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("kafka: close: handlers still running: %w", serr))
	}
	scancel()
	if c.metrics != nil {
		c.metrics.stop()
	}
	c.closeErr = errors.Join(errs...)
	return c.closeErr
}

// finalCommit commits the frontiers of ps, sending those the broker refused
// with a retriable error again (50 ms doubling to 1 s apart) until ctx ends;
// it returns those it could not commit (c.commitMu held).
func (c *Consumer) finalCommit(ctx context.Context, ps []*partition) []UncommittedPartition {
	backoff := 50 * time.Millisecond
	for {
		failed := c.commitLocked(ctx, ps, "close")
		if len(failed) == 0 || ctx.Err() != nil || !slices.ContainsFunc(failed, func(f UncommittedPartition) bool { return retriableCommit(f.Err) }) {
			return failed
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return failed
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// pastEnd returns a context that ends d after ctx ends (d from now when ctx
// has already ended), with ctx's values.
func pastEnd(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	out, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var mu sync.Mutex
	var t *time.Timer
	done := false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			t = time.AfterFunc(d, cancel)
		}
	})
	return out, func() {
		stop()
		mu.Lock()
		done = true
		if t != nil {
			t.Stop()
		}
		mu.Unlock()
		cancel()
	}
}
