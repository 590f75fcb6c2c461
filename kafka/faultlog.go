package kafka

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// faultLog turns a fault's many failed tries into a few log lines, one per
// state change of its class: the first failure (Warn, with its error), "still
// failing" after 10, 100, 1000... tries (Warn, with the last error), and the
// recovery (Info, with the failed tries and how long they lasted). The
// classes: offset commits, fetches, dead-letter produces.
type faultLog struct {
	log     *slog.Logger
	what    string // "offset commit", "fetch", "dead-letter produce"
	failing atomic.Bool
	mu      sync.Mutex
	tries   int
	since   time.Time
	next    int // the tries at which to say "still failing"
}

func newFaultLog(log *slog.Logger, what string) *faultLog {
	return &faultLog{log: log, what: what}
}

// fail counts a failed try; attrs describe it (err included).
func (f *faultLog) fail(err error, attrs ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tries++
	args := append([]any{"err", err}, attrs...)
	if f.tries == 1 {
		f.since = time.Now()
		f.next = 10
		f.failing.Store(true)
		f.log.Warn("kafka: "+f.what+" failing (retried; one line per 10x more tries until it recovers)", args...)
		return
	}
	if f.tries == f.next {
		f.next *= 10
		f.log.Warn("kafka: "+f.what+" still failing", append([]any{"tries", f.tries, "for", time.Since(f.since).Round(time.Millisecond)}, args...)...)
	}
}

// ok ends a failure, if any: cheap when nothing failed.
func (f *faultLog) ok() {
	if !f.failing.Load() {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tries == 0 {
		return
	}
	f.log.Info("kafka: "+f.what+" recovered", "failed_tries", f.tries, "for", time.Since(f.since).Round(time.Millisecond))
	f.tries = 0
	f.failing.Store(false)
}
