package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// isTerminal reports whether w is a terminal (a progress bar there is seen,
// elsewhere it is noise in a log).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progress shows how many of a run's events have been handled, on stderr.
// The bar is polled from the handled counter a few times a second, so the
// handlers pay nothing for it. The zero value and a disabled one do nothing.
type progress struct {
	bar  *progressbar.ProgressBar
	stop chan struct{}
	wg   sync.WaitGroup
}

func newProgress(w io.Writer, on bool, total int, name string) *progress {
	if !on {
		return &progress{}
	}
	return &progress{bar: progressbar.NewOptions64(int64(total),
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(fmt.Sprintf("%-18s", name)),
		progressbar.OptionSetWidth(30),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("events"),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)}
}

// start polls done until finish.
func (p *progress) start(done *atomic.Int64) {
	if p.bar == nil {
		return
	}
	p.stop = make(chan struct{})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(150 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				_ = p.bar.Set64(done.Load())
				return
			case <-t.C:
				_ = p.bar.Set64(done.Load())
			}
		}
	}()
}

// finish stops polling and clears the bar.
func (p *progress) finish() {
	if p.bar == nil {
		return
	}
	if p.stop != nil {
		close(p.stop)
		p.wg.Wait()
	}
	_ = p.bar.Finish()
	_ = p.bar.Clear()
}
