package service

import (
	"context"
	"time"
)

// Several instances on one database: each one's backlog (the per-partner
// count the intake's 429 reads, and the operator page's backlog and oldest
// age) is in memory, and an event one instance accepted is often delivered
// by another (the one whose relay holds the partner's lease): the first
// never hears of it. Without a sync its count only grew, until it answered
// 429 for ever. With Config.BacklogSync each instance replaces, every
// interval, its per-partner lists with the database's undelivered events.

// syncNote is what a sync needs besides the snapshot: the events whose
// intake transaction is open (committed to the backlog, not yet settled:
// a snapshot cannot see them), and, while a sync reads its snapshot, the
// events settled (they may have committed after the read) and finished
// (delivered or skipped here: the snapshot may still list them) since it
// began.
type syncNote struct {
	inTx    map[string]struct{}
	active  bool
	settled map[string]struct{}
	done    map[string]struct{}
}

// noteTx (commit) and noteDone (done) are called with b.mu held.
func (b *backlog) noteTx(id string) {
	if b.sync.inTx == nil {
		b.sync.inTx = map[string]struct{}{}
	}
	b.sync.inTx[id] = struct{}{}
}

func (b *backlog) noteDone(id string) {
	if b.sync.active {
		b.sync.done[id] = struct{}{}
	}
}

// settled ends an event's intake transaction (committed or not).
func (b *backlog) settled(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.sync.inTx, id)
	if b.sync.active {
		b.sync.settled[id] = struct{}{}
	}
}

func (b *backlog) beginSync() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sync.active = true
	b.sync.settled = map[string]struct{}{}
	b.sync.done = map[string]struct{}{}
}

// applySync replaces each partner's pending events with snap's (the
// database's, read after beginSync), minus those finished here since, plus
// those the snapshot could not see: their intake transaction still open, or
// settled since beginSync. An event settled before beginSync and absent
// from the snapshot was delivered or skipped (here or by another instance):
// it goes. snap nil (a failed read) changes nothing.
func (b *backlog) applySync(snap *backlog) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for name, p := range b.partners {
		if snap == nil {
			break
		}
		sp := snap.partners[name]
		if sp == nil {
			continue
		}
		var keep []pendingEvent
		for e := p.order.Front(); e != nil; e = e.Next() {
			ev := e.Value.(pendingEvent)
			if _, inSnap := sp.byID[ev.id]; inSnap {
				continue
			}
			_, open := b.sync.inTx[ev.id]
			_, late := b.sync.settled[ev.id]
			if open || late {
				keep = append(keep, ev)
			}
		}
		p.order.Init()
		clear(p.byID)
		for e := sp.order.Front(); e != nil; e = e.Next() {
			ev := e.Value.(pendingEvent)
			if _, fin := b.sync.done[ev.id]; !fin {
				p.add(ev.id, ev.received)
			}
		}
		for _, ev := range keep {
			p.add(ev.id, ev.received)
		}
	}
	b.sync.active, b.sync.settled, b.sync.done = false, nil, nil
}

// syncBacklog runs until stop is closed: every interval, it reloads the
// undelivered events from the database into s.backlog. A failed read is
// logged and tried again next interval.
func (s *Service) syncBacklog(interval time.Duration, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		s.backlog.beginSync()
		snap := newBacklog(s.cfg.MaxBacklog, s.partners)
		ctx, cancel := context.WithTimeout(context.Background(), max(interval, time.Second))
		err := s.store.loadPending(ctx, snap)
		cancel()
		if err != nil {
			s.backlog.applySync(nil) // ends the note, changes nothing
			s.log.Warn("backlog sync: reading the database", "err", err)
			continue
		}
		s.backlog.applySync(snap)
	}
}
