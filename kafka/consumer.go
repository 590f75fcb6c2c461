package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keysched/keysched"
	"github.com/keysched/keysched/internal/optcheck"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A Handler handles one record. It runs on a worker of the consumer's
// scheduler, never concurrently with another record of its key (see
// Ordering). Returning nil finishes the record; an error (or a panic) is a
// failed attempt, retried by the scheduler's retry policy and, when the
// attempts are spent, dead-lettered. ctx carries the values of Run's context
// and is cancelled when the record's partition is taken away (revoked: after
// the revoke timeout; lost: at once), when Close gives up, or at the
// scheduler's task timeout. A handler may run more than once for one record
// (at-least-once delivery): make it idempotent. It must not keep r after
// returning.
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
	cfg   config
	h     Handler
	cl    *kgo.Client
	sched *keysched.Scheduler[schedKey]
	// built is closed once NewConsumer has decided: c.cl set (made), or
	// left nil (refused after the client was made). franz-go calls the
	// group callbacks from its own goroutines as soon as NewClient
	// returns: they wait for built, and do nothing for a refused consumer
	// (whose client NewConsumer closes, which revokes what it was given).
	built  chan struct{}
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
	moving atomic.Int32 // Resume and Skip calls that took a key from parked and have not returned

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
	wakeCh     chan struct{} // wake's token for awaitRoom (buffered: one)
	awaiting   atomic.Bool   // awaitRoom waits: a finish that crosses its partition's bound wakes it
	room       roomState     // awaitRoom's (the poll loop's)
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
	// clientCancel ends the franz-go client's context (kgo.WithContext,
	// unless the caller gave their own): Close cuts franz-go's own
	// shutdown short with it (see Close).
	clientCancel context.CancelFunc

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
			return nil, refused(optcheck.NilOption(i, "Option"))
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
		wakeCh:     make(chan struct{}, 1),
		built:      make(chan struct{}),
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
	// The client's context comes first: a kgo.WithContext of the caller's
	// replaces it (and Close can then not cut franz-go's shutdown short).
	clientCtx, clientCancel := context.WithCancel(context.Background())
	copts := append([]kgo.Opt{kgo.WithContext(clientCtx)}, cfg.clientOpts...)
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
		clientCancel()
		_ = s.Close(context.Background())
		// Without a group franz-go refuses the options the adapter adds
		// ("invalid autocommit options specified when a group was not
		// specified": an option the caller never gave): a missing group
		// is the adapter's own refusal, as a missing topic is.
		if r := missingGroup(cfg.clientOpts); r != nil {
			return nil, refused(r)
		}
		refusal := refused(optcheck.Refuse("WithClientOptions", nil, "franz-go refuses the client's options (the adapter needs kgo.ConsumerGroup and kgo.ConsumeTopics or kgo.ConsumeRegex, and sets kgo.DisableAutoCommit itself: no kgo.AutoCommitMarks)"))
		var oe *keysched.OptionError
		if errors.As(refusal, &oe) {
			oe.Err = err // franz-go's, for errors.Is and errors.As
		}
		return nil, refusal
	}
	made := false
	defer func() {
		if made {
			return
		}
		// Refused, or a panic on the way (a caller's meter provider in
		// register): c.cl stays nil, so the group callbacks, released
		// here, do nothing; the client and the scheduler are closed.
		close(c.built)
		cl.Close()
		clientCancel()
		_ = s.Close(context.Background())
	}()
	group, _ := cl.OptValue(kgo.ConsumerGroup).(string)
	if r := clientConflicts(cl, group, &c.cfg); r != nil {
		return nil, refused(r)
	}
	// The group names the scheduler's metrics (register reads it); c.cl,
	// which tells the group callbacks the consumer was made, comes last.
	c.group = group
	if c.metrics != nil {
		if err := c.metrics.register(); err != nil {
			return nil, err
		}
	}
	c.cl = cl
	c.clientCancel = clientCancel
	c.intervalCommitTimeout = intervalCommitTimeout(cl)
	made = true
	close(c.built)
	return c, nil
}

// made waits until NewConsumer has decided and reports whether it made c
// (false: refused; the caller, a group callback, does nothing). A Consumer
// not made by NewConsumer (tests) counts as made.
func (c *Consumer) made() bool {
	if c.built == nil {
		return true
	}
	<-c.built
	return c.cl != nil
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

// clientConflicts refuses what the client's options and the consumer's
// cannot both hold: no group or no topic; a dead-letter topic among the
// consumed ones (a record failing for good would be dead-lettered into the
// stream it came from, and fail again there, for ever); a revoke timeout not
// below the group's rebalance timeout (a revoke waiting that long for its
// handlers holds the member's rejoin past the rebalance timeout, and the
// group drops the member). The default revoke timeout gives way instead: it
// becomes half the rebalance timeout.
func clientConflicts(cl *kgo.Client, group string, cfg *config) *optcheck.Refusal {
	if group == "" {
		return needGroupAndTopics("kgo.ConsumerGroup")
	}
	if len(cl.GetConsumeTopics()) == 0 && !isRegex(cl) {
		return needGroupAndTopics("kgo.ConsumeTopics")
	}
	if cfg.dlqTopic != "" {
		topics, _ := cl.OptValue(kgo.ConsumeTopics).([]string)
		for _, t := range topics {
			match := t == cfg.dlqTopic
			if isRegex(cl) {
				re, err := regexp.Compile(t)
				match = err == nil && re.MatchString(cfg.dlqTopic)
			}
			if match {
				return optcheck.Conflict("WithDeadLetterTopic", "WithClientOptions",
					"dead-letter topic %q is consumed (kgo.ConsumeTopics %q): a record failing for good would fail again in it, for ever", cfg.dlqTopic, t)
			}
		}
	}
	if rt, _ := cl.OptValue(kgo.RebalanceTimeout).(time.Duration); rt > 0 && cfg.revokeTimeout >= rt {
		if !cfg.revokeSet { // the default gives way
			cfg.revokeTimeout = rt / 2
			return nil
		}
		return optcheck.Conflict("WithRevokeTimeout", "WithClientOptions",
			"revoke timeout %v not below kgo.RebalanceTimeout %v: a revoke waiting that long holds the member's rejoin past the rebalance timeout, and the group drops it", cfg.revokeTimeout, rt)
	}
	return nil
}

// needGroupAndTopics is the refusal of client options without what (a
// group or topics).
func needGroupAndTopics(what string) *optcheck.Refusal {
	return optcheck.Refuse("WithClientOptions", nil, "no %s: need kgo.ConsumerGroup and kgo.ConsumeTopics (or kgo.ConsumeRegex)", what)
}

// missingGroup is the refusal of client options that name no consumer
// group, or nil when they name one or franz-go refuses them on their own.
// It makes (and closes) a client of the caller's options alone (franz-go
// keeps its options to itself), consuming nothing: with topics or
// partitions to consume, the client would ask the brokers for metadata at
// once, and, with a group, join it (a rebalance of the group's live members
// for a NewConsumer that is refused).
func missingGroup(opts []kgo.Opt) *optcheck.Refusal {
	opts = append(opts[:len(opts):len(opts)], kgo.ConsumeTopics(), kgo.ConsumePartitions(nil))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil
	}
	defer cl.Close()
	if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g != "" {
		return nil
	}
	return needGroupAndTopics("kgo.ConsumerGroup")
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
