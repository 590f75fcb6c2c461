package kafka

import (
	"context"
	"errors"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/keysched/keysched"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A group is one scheduler task: the records of one chain (a key under
// KeyOrder, the partition under PartitionOrder, one record under Unordered)
// that arrived in one poll, handled one after another in offset order. One
// task per group instead of one per record is what keeps the adapter's cost
// per record near a plain consumer's; the offsets are still tracked record
// by record.
//
// Retries stay per record. The scheduler counts a task's attempts, so a
// group's failing attempt must be the failing record's own: a group returns
// a record's error to the scheduler only while every failure of the group so
// far was that record's (failAt). A record that fails after an earlier one
// failed and then succeeded is handed on, with the rest of the group, to a
// group of its own, its error stashed as that group's first attempt (so its
// attempts are counted exactly once). After a dead letter (or Skip) the rest
// is handed on the same way. Handing on puts the records at the front of the
// key's next group when there is one (it cannot have started: this group
// holds the key), else into a new group submitted behind this one.
type group struct {
	context.Context // the handlers' (Run's context's values); the task finds its group in it
	p               *partition
	key             schedKey
	null            bool   // the chain's p.last entry is p.lastNil
	lastKey         string // else p.last's key; unused under Unordered
	poll            uint64 // the poll that made it

	// items, cur and failAt belong to the task that runs the group (and,
	// before it is submitted, to the poll loop under p.mu; a handing-on
	// predecessor under p.mu, which can only happen before this group
	// starts).
	items []*item
	// one is items' first backing array (most groups hold one record);
	// cleared with items when the group finishes: a finished group kept
	// in p.last must keep no item's chunk (takeItem) reachable.
	one    [1]*item
	cur    int // the next record to run
	failAt int // the record the group's failed attempts were counted for; -1 none

	// next is the key's next group (set under p.mu), cleared when this
	// group finishes: a group kept reachable (by p.last, by the
	// scheduler's chain of the key) must not keep every later group of
	// its key reachable through it, for as long as the key stays busy.
	next     atomic.Pointer[group]
	finished atomic.Bool // all its records finished or handed on
	// handedOn: it holds records handed on from a dispatched group (p.mu).
	// Close dispatches such a group when it is held back: those records
	// were dispatched, and Close waits for the dispatched records.
	handedOn bool
	comp     atomic.Pointer[keysched.Completion]
}

// current returns the record the group is at (after a failed attempt: the
// one that failed).
func (g *group) current() *item {
	if g.cur < len(g.items) {
		return g.items[g.cur]
	}
	return nil
}

type groupKey struct{}

func (g *group) Value(k any) any {
	if k == (groupKey{}) {
		return g
	}
	return g.Context.Value(k)
}

// runGroup is the scheduler task of every group: the group is the context
// it was submitted with (one function for every group, no closure each).
// The scheduler's dead-letter function finds a failed group through
// c.failing (see fail).
func runGroup(ctx context.Context) error {
	g, _ := ctx.Value(groupKey{}).(*group)
	return g.run(ctx)
}

// run runs the group's records from g.cur on.
func (g *group) run(ctx context.Context) error {
	p := g.p
	if !p.enter(false) {
		return nil // the partition was revoked: dropped, not finished
	}
	defer p.leave()
	returned := false
	defer func() {
		if !returned {
			// The handler called runtime.Goexit: the scheduler counts the
			// attempt as a panic, so it is this record's failed attempt.
			g.failAt = g.cur
			p.c.fail(g)
		}
	}()
	h := p.c.h
	for g.cur < len(g.items) {
		if !p.active() {
			// Revoked (or lost) meanwhile: no handler of the partition
			// starts any more; the rest is dropped, not finished, for the
			// next owner, like the records of groups not yet started.
			returned = true
			if g.failAt >= 0 {
				p.c.failed(g.key, g)
			}
			return nil
		}
		it := g.items[g.cur]
		var err error
		called := it.stash == nil
		if !called {
			err, it.stash = *it.stash, nil // the failure a predecessor saw: this attempt
		} else {
			it.attempts.Add(1)
			if m := p.c.metrics; m != nil {
				start := time.Now()
				err = callHandler(ctx, h, it.record())
				m.processed(p.topic, p.id, time.Since(start), err != nil)
			} else {
				err = callHandler(ctx, h, it.record())
			}
		}
		if err == nil {
			p.c.succeeded.Add(1)
			it.finish()
			g.cur++
			continue
		}
		if called && (!keysched.IsSnoozed(err) || keysched.IsPermanent(err)) {
			p.c.failedAttempts.Add(1)
		}
		if errors.Is(ctx.Err(), context.Canceled) {
			// Interrupted (revoke timeout, Close gave up): not a failure.
			it.interrupt()
			p.c.fail(g)
			returned = true
			return err
		}
		if called && keysched.IsSnoozed(err) && !keysched.IsPermanent(err) {
			// A snoozed run is not an attempt (see keysched.Snooze): the
			// scheduler does not count it, nor does the record (a stashed
			// error was judged when its handler call returned). A run
			// interrupted above is counted, as the scheduler counts it.
			it.attempts.Add(-1)
		}
		if g.failAt < 0 || g.failAt == g.cur {
			g.failAt = g.cur // the scheduler's attempts are this record's
			p.c.fail(g)
			returned = true
			return err
		}
		it.stash = new(error) // not &err: err would move to the heap for every record
		*it.stash = err
		returned = true
		g.handOn(g.cur)
		return nil
	}
	returned = true
	g.items, g.one[0] = nil, nil // let go of the records (a finished group may stay in p.last a while)
	g.finished.Store(true)
	g.next.Store(nil) // after finished: see addTo
	if g.failAt >= 0 {
		p.c.failed(g.key, g)
	}
	return nil
}

// fail registers g as its key's failing group, for the dead-letter function
// (only one group of a key runs at a time, and its dead letter is delivered
// before the key's next group starts).
func (c *Consumer) fail(g *group) {
	c.failMu.Lock()
	c.failing[g.key] = g
	c.failMu.Unlock()
}

// failed takes the failing group of key k (nil if none); with want set, only
// if it is want.
func (c *Consumer) failed(k schedKey, want *group) *group {
	c.failMu.Lock()
	defer c.failMu.Unlock()
	g := c.failing[k]
	if g == nil || (want != nil && g != want) {
		return nil
	}
	delete(c.failing, k)
	return g
}

// callHandler runs h, turning a panic into a *keysched.PanicError with the
// handler's stack (the consumer retries panics like errors, as
// keysched.WithRetryPanics does, and dead-letters them with their value).
func callHandler(ctx context.Context, h Handler, r *kgo.Record) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &keysched.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return h(ctx, r)
}

// handOn moves the group's records from index i on to the key's next group,
// or to a new group behind this one, and marks this one finished.
func (g *group) handOn(i int) {
	p := g.p
	c := p.c
	p.mu.Lock()
	defer p.mu.Unlock()
	rest := g.items[i:]
	next := g.next.Load()
	defer func() { g.one[0] = nil }() // after rest is taken (it may be g.one)
	g.items = nil
	g.finished.Store(true)
	g.next.Store(nil)
	if g.failAt >= 0 {
		c.failed(g.key, g)
	}
	if len(rest) == 0 || !p.active() {
		return // nothing left, or not ours any more: the next owner handles them
	}
	if n := next; n != nil {
		n.handedOn = true
		items := make([]*item, 0, len(rest)+len(n.items))
		n.items = append(append(items, rest...), n.items...)
		for _, it := range rest {
			it.g = n // Skip and interrupt find a record's group through it
		}
		return
	}
	ng := c.newGroup(p, g.key, g.null, g.lastKey, rest)
	ng.handedOn = true
	if c.cfg.ordering != Unordered && p.lastOf(g.null, g.lastKey) == g {
		p.setLast(g.null, g.lastKey, ng)
	}
	if len(p.held) > 0 || !c.dispatch(ng) {
		p.held = append(p.held, ng)
		c.adjustPause(p)
		c.wake()
	}
}

// newGroup makes a group of items (p.mu held).
func (c *Consumer) newGroup(p *partition, key schedKey, null bool, lastKey string, items []*item) *group {
	g := &group{Context: c.runCtx, p: p, key: key, null: null, lastKey: lastKey, poll: p.polls, failAt: -1}
	if len(items) == 1 {
		g.one[0] = items[0]
		g.items = g.one[:1:1]
	} else {
		g.items = items
	}
	for _, it := range items {
		it.g = g
	}
	return g
}

// newGroupOf makes a group of one item (p.mu held).
func (c *Consumer) newGroupOf(p *partition, key schedKey, null bool, lastKey string, it *item) *group {
	g := &group{Context: c.runCtx, p: p, key: key, null: null, lastKey: lastKey, poll: p.polls, failAt: -1}
	g.one[0] = it
	g.items = g.one[:1:1]
	it.g = g
	return g
}

// addTo puts it (just fetched, r its record) into this poll's group of its
// chain, or a new group appended to groups (p.mu held).
func (c *Consumer) addTo(p *partition, groups []*group, it *item, r *kgo.Record) []*group {
	if c.cfg.ordering == Unordered {
		return append(groups, c.newGroupOf(p, c.keyOf(r), false, "", it))
	}
	null := c.cfg.ordering == PartitionOrder || r.Key == nil
	var prev *group
	if null {
		prev = p.lastNil
	} else {
		prev = p.last[string(r.Key)] // no allocation for the look-up
	}
	// With a task timeout (perRecord) every record is a group of its own:
	// a group's records would share one attempt's deadline.
	if prev != nil && prev.poll == p.polls && !prev.finished.Load() && !c.perRecord {
		prev.items = append(prev.items, it) // made by this poll: not submitted yet
		it.g = prev
		return groups
	}
	var k schedKey
	var ks string
	if c.cfg.ordering == PartitionOrder {
		k = schedKey{topic: p.topic, part: p.id, off: -1}
	} else {
		if prev != nil {
			ks = prev.lastKey // the same bytes: no new string
		} else if !null {
			ks = string(r.Key)
		}
		k = schedKey{topic: p.topic, part: p.id, null: null, key: ks, off: -1}
	}
	ng := c.newGroupOf(p, k, null, ks, it)
	if prev != nil && !prev.finished.Load() {
		prev.next.Store(ng)
		if prev.finished.Load() {
			// It finished meanwhile, and may have cleared next
			// before the store: a finished group keeps no next.
			prev.next.CompareAndSwap(ng, nil)
		}
	}
	p.setLast(null, ks, ng)
	return append(groups, ng)
}

// sweepLast forgets finished groups in p.last when it has grown (p.mu held).
func (p *partition) sweepLast() {
	if len(p.last) <= p.lastSweep {
		return
	}
	for k, g := range p.last {
		if g.finished.Load() {
			delete(p.last, k)
		}
	}
	p.lastSweep = max(1024, 2*len(p.last))
}
