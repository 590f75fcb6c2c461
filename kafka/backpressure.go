package kafka

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
