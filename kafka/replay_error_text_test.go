package kafka

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// Replay's errors read as sentences: an empty dead-letter topic says so
// (not an empty list of ranges, "()"), a refusal lists its problems after
// one colon (not ":;"), and counts agree with their nouns. errors.Is and
// errors.As find what they found before.
func TestReplayErrorTextsReadAsSentences(t *testing.T) {
	tc := newCluster(t, 1, "t", "orders.dlq", "one", "mixed")
	at := time.Now()
	tc.produce(t, rec("mixed", 0, "a", "not a dead letter"), rec("mixed", 0, "b", "not one either"),
		deadLetterRec("one", 0, "a", "1", at, dl("t", 0, 1, "boom")))
	for _, c := range []struct {
		name     string
		o        ReplayOptions
		sentinel error
		text     string // the whole text, or its beginning when it ends in "..."
	}{
		{"empty dead-letter topic", ReplayOptions{DeadLetterTopic: "orders.dlq"}, ErrNothingToReplay,
			"kafka: no dead letter matches: orders.dlq has no records to read in partition 0"},
		{"offset range past the end", ReplayOptions{DeadLetterTopic: "one", StartOffset: 5}, ErrNothingToReplay,
			"kafka: no dead letter matches: one has no records to read in partition 0 at offsets [5, end)"},
		{"one dead letter, none selected", ReplayOptions{DeadLetterTopic: "one", ErrorContains: "nope"}, ErrNothingToReplay,
			"kafka: no dead letter matches: 1 dead letter read in one (partition 0 offsets [0, 1)), none selected by the filters"},
		{"one record not a dead letter", ReplayOptions{DeadLetterTopic: "mixed", EndOffset: 1}, ErrNotDeadLetter,
			"kafka: replay refused, nothing written: 1 selected dead letter cannot be replayed: mixed/0@0: kafka: not one of the adapter's dead letters..."},
		{"two records not dead letters", ReplayOptions{DeadLetterTopic: "mixed"}, ErrNotDeadLetter,
			"kafka: replay refused, nothing written: 2 selected dead letters cannot be replayed: mixed/0@0: kafka: not one of the adapter's dead letters..."},
	} {
		_, err := replay(t, tc, c.o)
		if !errors.Is(err, c.sentinel) {
			t.Errorf("%s: %v, want %v", c.name, err, c.sentinel)
			continue
		}
		var refused *ReplayRefusedError
		if errors.Is(c.sentinel, ErrNotDeadLetter) && !errors.As(err, &refused) {
			t.Errorf("%s: %T, want a *ReplayRefusedError", c.name, err)
		}
		got := err.Error()
		if want, ok := strings.CutSuffix(c.text, "..."); ok && !strings.HasPrefix(got, want) || !ok && got != c.text {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.text)
		}
		if strings.Contains(got, "()") || strings.Contains(got, ":;") {
			t.Errorf("%s: %q has an empty part", c.name, got)
		}
		if n := strings.Count(got, "; mixed/0@"); refused != nil && n != len(refused.Problems)-1 {
			t.Errorf("%s: %q separates %d problems with %d \"; \"", c.name, got, len(refused.Problems), n)
		}
	}
}
