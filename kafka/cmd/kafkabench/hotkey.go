package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// HotKeyGaps is where the run's time went for its hottest key, whose
// records run back to back are the bound when the hottest key is. Durations
// in ms: LeadIn + Work + NotFetched + NotPolled + NotStarted + Tail is the
// run's time.
type HotKeyGaps struct {
	Records int `json:"records"`
	// LeadIn: from the run's start (its first record polled) to the start
	// of the key's first record's work; Lead* split it like a gap.
	LeadIn         float64 `json:"lead_in_ms"`
	LeadNotFetched float64 `json:"lead_in_not_fetched_ms"`
	LeadNotPolled  float64 `json:"lead_in_not_polled_ms"`
	LeadNotStarted float64 `json:"lead_in_not_started_ms"`
	// Work: the key's records' work as it ran (the handler's call of the
	// work, summed); WorkMean per record; WorkBy100 the mean per record
	// of each hundred records in order (the first hundred ran while the
	// stream's other keys were busy too, see Running).
	Work      float64   `json:"work_ms"`
	WorkMean  float64   `json:"work_mean_ms"`
	WorkBy100 []float64 `json:"work_by_100_ms"`
	// Gaps between the end of one of its records and the start of the
	// next, split by what the next one waited for: NotFetched (not yet in
	// the client's buffer: fetch latency, a paused partition), NotPolled
	// (in the buffer, not yet handed to the adapter by a poll), NotStarted
	// (polled, not started: held, queued in the scheduler, the chain's
	// hand-off to a worker). GapsNotFetched and GapsNotPolled count the
	// gaps whose next record was not fetched, not polled, when the
	// previous one ended; GapsOver1ms the gaps longer than 1 ms, GapMax
	// the longest.
	NotFetched     float64 `json:"gap_not_fetched_ms"`
	NotPolled      float64 `json:"gap_not_polled_ms"`
	NotStarted     float64 `json:"gap_not_started_ms"`
	GapsNotFetched int     `json:"gaps_not_fetched"`
	GapsNotPolled  int     `json:"gaps_not_polled"`
	GapsOver1ms    int     `json:"gaps_over_1ms"`
	GapMax         float64 `json:"gap_max_ms"`
	// Tail: from the end of the key's last record to the end of the run.
	Tail float64 `json:"tail_ms"`
	// Running: the handlers (of every key) running, mean over each 50 ms
	// of the run.
	Running []float64 `json:"running_per_50ms"`
}

// hotKey splits the run's time for the hottest key (see HotKeyGaps).
func (t *tally) hotKey() *HotKeyGaps {
	n := make([]int, t.s.keys)
	hot := int32(0)
	for _, id := range t.s.ids {
		n[id]++
		if n[id] > n[hot] {
			hot = id
		}
	}
	var seqs []int
	for i, id := range t.s.ids {
		if id == hot {
			seqs = append(seqs, i)
		}
	}
	ms := func(ns int64) float64 { return float64(ns) / 1e6 }
	h := &HotKeyGaps{Records: len(seqs)}
	// split adds the wait from prev (ns) until seq's start to the three
	// parts: until fetched, until polled, until started.
	// (With --hot-key every event is sampled: t.polled is by seq.)
	split := func(prev int64, seq int, f, p, s *float64) (fetched, polled bool) {
		b, pl, st := t.buffered[seq].Load(), t.polled[seq].Load(), t.began[seq]
		b = max(b, prev)
		pl = max(pl, b)
		*f += ms(b - prev)
		*p += ms(pl - b)
		*s += ms(st - pl)
		return b > prev, pl > prev
	}
	start, end := t.start.Load(), t.end.Load()
	split(start, seqs[0], &h.LeadNotFetched, &h.LeadNotPolled, &h.LeadNotStarted)
	h.LeadIn = ms(t.began[seqs[0]] - start)
	var hundred float64
	for i, seq := range seqs {
		w := ms(t.ended[seq] - t.began[seq])
		h.Work += w
		if hundred += w; i%100 == 99 || i == len(seqs)-1 {
			h.WorkBy100 = append(h.WorkBy100, hundred/float64(i%100+1))
			hundred = 0
		}
		if i == 0 {
			continue
		}
		prev := t.ended[seqs[i-1]]
		nf, np := split(prev, seq, &h.NotFetched, &h.NotPolled, &h.NotStarted)
		if nf {
			h.GapsNotFetched++
		} else if np {
			h.GapsNotPolled++
		}
		g := ms(t.began[seq] - prev)
		h.GapMax = max(h.GapMax, g)
		if g > 1 {
			h.GapsOver1ms++
		}
	}
	h.WorkMean = h.Work / float64(len(seqs))
	h.Tail = ms(end - t.ended[seqs[len(seqs)-1]])
	const bucket = int64(50 * time.Millisecond)
	h.Running = make([]float64, (end-start)/bucket+1)
	for seq := range t.began {
		for b := (t.began[seq] - start) / bucket; b >= 0 && b < int64(len(h.Running)); b++ {
			lo, hi := start+b*bucket, start+(b+1)*bucket
			o := min(hi, t.ended[seq]) - max(lo, t.began[seq])
			if o <= 0 {
				break
			}
			h.Running[b] += float64(o) / float64(bucket)
		}
	}
	return h
}

// printHotKey prints h, from consumer name's run.
func printHotKey(w io.Writer, name string, h *HotKeyGaps) {
	r := func(xs []float64, f string) string {
		var b strings.Builder
		for i, x := range xs {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, f, x)
		}
		return b.String()
	}
	run := h.LeadIn + h.Work + h.NotFetched + h.NotPolled + h.NotStarted + h.Tail
	fmt.Fprintf(w, "%s, hottest key (%d records) over the run's %.1f ms: lead-in %.1f ms (not fetched %.1f, not polled %.1f, not started %.1f); work %.1f ms (%.3f ms a record; by hundred records: %s); gaps %.1f ms (not fetched %.1f ms in %d gaps, not polled %.1f ms in %d, not started %.1f ms; %d over 1 ms, longest %.2f ms); tail %.1f ms\n",
		name, h.Records, run, h.LeadIn, h.LeadNotFetched, h.LeadNotPolled, h.LeadNotStarted, h.Work, h.WorkMean, r(h.WorkBy100, "%.3f"),
		h.NotFetched+h.NotPolled+h.NotStarted, h.NotFetched, h.GapsNotFetched, h.NotPolled, h.GapsNotPolled, h.NotStarted, h.GapsOver1ms, h.GapMax, h.Tail)
	fmt.Fprintf(w, "%s, handlers running (all keys), mean per 50 ms: %s\n", name, r(h.Running, "%.0f"))
}

// bufferedHook is the franz-go hook of --hot-key alone (no cost per
// record without it): a fetched record enters the client's buffer.
type bufferedHook struct{ t *tally }

func (h bufferedHook) OnFetchRecordBuffered(r *kgo.Record) {
	t := h.t
	if seq, _, _, ok := decodeValue(r.Value); ok && seq < len(t.buffered) {
		t.buffered[seq].CompareAndSwap(0, time.Now().UnixNano())
	}
}
