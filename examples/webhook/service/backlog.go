package service

import (
	"container/list"
	"sort"
	"sync"
	"time"
)

// backlog tracks, in memory, each partner's accepted and undelivered events:
// how many, and the intake time of the oldest. The intake's 429 decision
// reads it (nothing slow in the request); the database is the truth, and the
// tracker is rebuilt from it at start.
type backlog struct {
	mu       sync.Mutex
	bound    int
	partners map[string]*partnerBacklog
	sync     syncNote // backlogsync.go
}

type partnerBacklog struct {
	reserved int                      // admitted, not yet committed or released
	order    *list.List               // of pendingEvent, in intake order
	byID     map[string]*list.Element // event ID -> its element
	// counters since start
	delivered, failed, parks, skipped uint64
	lastErr                           string
}

type pendingEvent struct {
	id       string
	received time.Time
}

func newBacklog(bound int, partners []string) *backlog {
	b := &backlog{bound: bound, partners: map[string]*partnerBacklog{}}
	for _, p := range partners {
		b.partners[p] = &partnerBacklog{order: list.New(), byID: map[string]*list.Element{}}
	}
	return b
}

// reserve admits one more event for partner when its backlog (pending plus
// reserved) is below the bound. A reservation ends with commit or release.
func (b *backlog) reserve(partner string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.partners[partner]
	if p == nil || p.order.Len()+p.reserved >= b.bound {
		return false
	}
	p.reserved++
	return true
}

func (b *backlog) release(partner string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p := b.partners[partner]; p != nil && p.reserved > 0 {
		p.reserved--
	}
}

// commit turns a reservation into a pending event. The intake calls it just
// before the event's transaction, so that a delivery, which can only follow
// the commit, always finds the event here (drop undoes it if the
// transaction fails).
func (b *backlog) commit(partner, id string, received time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.partners[partner]
	if p == nil {
		return
	}
	if p.reserved > 0 {
		p.reserved--
	}
	p.add(id, received)
	b.noteTx(id)
}

func (p *partnerBacklog) add(id string, received time.Time) {
	if _, ok := p.byID[id]; ok {
		return
	}
	p.byID[id] = p.order.PushBack(pendingEvent{id: id, received: received})
}

// drop removes an event whose transaction failed (it was never written).
func (b *backlog) drop(partner, id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.partners[partner]
	if p == nil {
		return
	}
	if e, ok := p.byID[id]; ok {
		p.order.Remove(e)
		delete(p.byID, id)
	}
}

// load adds an event found pending in the database at start.
func (b *backlog) load(partner, id string, received time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p := b.partners[partner]; p != nil {
		p.add(id, received)
	}
}

// done removes a delivered (or skipped) event. Unknown IDs are ignored: a
// duplicate delivery after a restart finds its event already gone.
func (b *backlog) done(partner, id string, delivered bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.partners[partner]
	if p == nil {
		return
	}
	b.doneLocked(p, id, delivered)
}

func (b *backlog) doneLocked(p *partnerBacklog, id string, delivered bool) {
	if e, ok := p.byID[id]; ok {
		p.order.Remove(e)
		delete(p.byID, id)
	}
	b.noteDone(id)
	if delivered {
		p.delivered++
	} else {
		p.skipped++
	}
}

// doneIfPending is done for an event the backlog still holds; it reports
// whether it did (an event already taken off is not counted twice).
func (b *backlog) doneIfPending(partner, id string, delivered bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.partners[partner]
	if p == nil {
		return false
	}
	if _, ok := p.byID[id]; !ok {
		return false
	}
	b.doneLocked(p, id, delivered)
	return true
}

func (b *backlog) failedAttempt(partner string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p := b.partners[partner]; p != nil {
		p.failed++
		p.lastErr = err.Error()
	}
}

func (b *backlog) parked(partner string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p := b.partners[partner]; p != nil {
		p.parks++
	}
}

// PartnerStatus is one partner's line on the operator page and in metrics.
type PartnerStatus struct {
	Partner     string
	Destination string
	Backlog     int           // accepted, not yet delivered (nor skipped)
	OldestAge   time.Duration // age of the oldest undelivered event; 0 when none
	Parked      bool
	Breaker     string // the destination's circuit breaker state
	Delivered   uint64 // deliveries that got a 2xx, since start
	Failed      uint64 // failed delivery attempts, since start
	Parks       uint64 // times the partner was parked, since start
	Skipped     uint64 // events skipped by an operator, since start
	LastError   string // the last failed attempt's error
	// Head is, for a parked partner, the ID of its parked head delivery
	// (the oldest dead outbox row): the event's ID, or for a replay of it
	// the replay's ID; Skip takes it. HeadEvent is that event's ID (Head
	// unless the head is a replay). Both empty when not parked.
	Head, HeadEvent string
}

// snapshot returns every partner's status, by backlog then age, largest
// first (parked and breaker fields are the caller's to fill).
func (b *backlog) snapshot(now time.Time) []PartnerStatus {
	b.mu.Lock()
	out := make([]PartnerStatus, 0, len(b.partners))
	for name, p := range b.partners {
		st := PartnerStatus{
			Partner: name, Backlog: p.order.Len(),
			Delivered: p.delivered, Failed: p.failed, Parks: p.parks, Skipped: p.skipped,
			LastError: p.lastErr,
		}
		if f := p.order.Front(); f != nil {
			st.OldestAge = max(0, now.Sub(f.Value.(pendingEvent).received))
		}
		out = append(out, st)
	}
	b.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Backlog != out[j].Backlog {
			return out[i].Backlog > out[j].Backlog
		}
		if out[i].OldestAge != out[j].OldestAge {
			return out[i].OldestAge > out[j].OldestAge
		}
		return out[i].Partner < out[j].Partner
	})
	return out
}

// total returns the number of undelivered events over all partners.
func (b *backlog) total() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, p := range b.partners {
		n += p.order.Len()
	}
	return n
}
