package kafka

import (
	"context"
	"time"
)

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

// dispatchHandedOn submits the held groups that hold records handed on from
// a dispatched group (see group.handedOn), each only when no earlier held
// group of its key is left, for Close: the poll loop, which dispatches held
// groups, has ended. It reports whether it submitted any.
func (c *Consumer) dispatchHandedOn() bool {
	sent := false
	for _, p := range c.owned() {
		p.mu.Lock()
		if p.active() && len(p.held) > 0 {
			var blocked map[schedKey]struct{}
			kept := p.held[:0]
			for _, g := range p.held {
				if _, b := blocked[g.key]; !b && g.handedOn && c.dispatch(g) {
					sent = true
					continue
				}
				if blocked == nil {
					blocked = make(map[schedKey]struct{})
				}
				blocked[g.key] = struct{}{}
				kept = append(kept, g)
			}
			clear(p.held[len(kept):])
			p.held = kept
			c.adjustPause(p)
		}
		p.mu.Unlock()
	}
	return sent
}

// resumeAt is the in-flight count at which a paused partition resumes: an
// eighth of the bound free (at least one record). Not half: a stuck key
// holding more than the resume point would keep its partition paused while
// other keys could go on; with an eighth, only a key holding nearly the
// whole bound does.
func resumeAt(bound int) int64 { return int64(bound - max(1, bound/8)) }

// adjustPause pauses p when it has held records, and resumes it once an
// eighth of the bound is free with nothing held (p.mu held). A partition at
// its in-flight bound is paused by awaitRoom, not here.
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
	switch {
	case !p.paused.Load() && len(p.held) > 0:
		c.pause(p)
	case p.paused.Load() && len(p.held) == 0 && p.inflight.Load() <= resumeAt(c.cfg.maxInFlight):
		p.paused.Store(false)
		c.heldParts.Add(-1)
		c.cl.ResumeFetchPartitions(map[string][]int32{p.topic: {p.id}})
	}
}

// pause stops fetching p (p.mu held, p active and not paused).
func (c *Consumer) pause(p *partition) {
	p.paused.Store(true)
	c.heldParts.Add(1)
	c.cl.PauseFetchPartitions(map[string][]int32{p.topic: {p.id}})
}

// Waiting for room: see awaitRoom.
const (
	// roomSlice: a partition at its bound that finishes no record for
	// this long is paused.
	roomSlice = 10 * time.Millisecond
	// roomWait: a partition still at its bound after this long is paused.
	roomWait = 100 * time.Millisecond
)

// roomState is awaitRoom's, kept between its calls (the poll loop's alone).
type roomState struct {
	since time.Time // when a partition was first seen at its bound; zero: none is
	slice time.Time // when the current slice started
	last  int64     // the records in flight of the partitions at the bound then
	// run is when the current run of polls each of which left a
	// partition at its bound started (zero: none runs; it ends when a poll
	// leaves none at it, or partitions are paused): see awaitRoom.
	run    time.Time
	polled bool // a poll ran since awaitRoom last looked
}

// awaitRoom runs before each poll and returns false when no active,
// unpaused partition is at its in-flight bound (a poll may bring such a
// partition up to WithMaxPollRecords more records, past bound + one poll),
// true when wake was called meanwhile (the loop looks at held records, then
// calls it again).
//
// Pausing a partition at its bound at once, as the poll loop did before,
// makes franz-go drop its buffered records and fetch them again on resume:
// with fast handlers that happened on nearly every poll. So the loop first
// waits, not polling (heartbeats, rebalances and franz-go's fetching go on),
// for such partitions to finish records and fall below the bound, and
// pauses those still at it when none of them finished a record for
// roomSlice, or after roomWait in all: a stuck key's partition is paused
// within roomSlice of reaching its bound, and the other partitions' records
// wait at most roomWait. It returns at once when Close starts or ctx ends.
//
// roomWait bounds the waits of a run of polls too, not only each wait:
// franz-go hands out a fetch's records partition after partition, so a
// busy partition that falls below its bound within roomWait after every
// poll would otherwise keep the records fetched for the others behind its
// own until its whole fetch is handled (seconds). While other active,
// unpaused partitions are owned and franz-go holds fetched records not yet
// polled, the partitions at their bound are paused once roomWait passed
// since the run of polls each of which left a partition at its bound began.
func (c *Consumer) awaitRoom(ctx context.Context) (woken bool) {
	bound := int64(c.cfg.maxInFlight)
	r := &c.room
	c.awaiting.Store(true) // before looking: a finish that crosses the bound after the look wakes the loop
	defer c.awaiting.Store(false)
	first := r.polled
	r.polled = false
	for {
		var full []*partition
		total := int64(0)
		open := 0 // active, unpaused partitions below their bound
		for _, p := range c.owned() {
			if !p.active() || p.paused.Load() {
				continue
			}
			if n := p.inflight.Load(); n >= bound {
				full = append(full, p)
				total += n
			} else {
				open++
			}
		}
		if len(full) == 0 || c.closing.Load() || ctx.Err() != nil {
			if first && len(full) == 0 {
				r.run = time.Time{} // the last poll left no partition at its bound
			}
			r.since = time.Time{}
			return false
		}
		first = false
		now := time.Now()
		if r.since.IsZero() {
			r.since, r.slice, r.last = now, now, total
		}
		if r.run.IsZero() {
			r.run = now
		}
		end := r.since.Add(roomWait)
		if open > 0 && c.cl.BufferedFetchRecords() > 0 {
			end = r.run.Add(roomWait) // others' records may wait behind these partitions'
		}
		switch {
		case !now.Before(end) || now.Sub(r.slice) >= roomSlice && total >= r.last:
			for _, p := range full {
				p.mu.Lock()
				if p.active() && !p.paused.Load() && p.inflight.Load() >= bound {
					c.pause(p)
				}
				p.mu.Unlock()
			}
			r.since, r.run = time.Time{}, time.Time{}
			continue
		case now.Sub(r.slice) >= roomSlice:
			r.slice, r.last = now, total // progress: a new slice
		}
		t := time.NewTimer(min(r.slice.Add(roomSlice).Sub(now), end.Sub(now)))
		select {
		case <-c.wakeCh:
			t.Stop()
			return true
		case <-t.C:
		case <-c.stop:
		case <-ctx.Done():
		}
		t.Stop()
	}
}
