package main

import (
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Copied from cmd/keybench, so that io=DUR means the same in both programs.
//
// On Linux, io=DUR waits on a kernel timer (a timerfd) through Go's network
// poller, exactly as a goroutine waits for a socket: the goroutine parks,
// its worker is free for others, and it wakes when the kernel says the fd is
// readable. time.Sleep would be simpler but is not precise enough here: with
// the process otherwise idle, Go's poller rounds sleeps under a millisecond
// up to about 1.1 ms, so io=200us would mean io=1.1ms.
//
// Each concurrent wait needs an fd of its own; they are kept in a free list
// and reused. Past maxTimerFDs concurrent waits (or when the fd limit is
// reached) a wait falls back to time.Sleep.

const maxTimerFDs = 8192

type timerFD struct {
	f  *os.File // pollable: the fd is non-blocking
	fd int
}

var (
	freeTimerFDs = make(chan *timerFD, maxTimerFDs)
	timerFDs     atomic.Int64 // made so far
)

func getTimerFD() *timerFD {
	select {
	case t := <-freeTimerFDs:
		return t
	default:
	}
	if timerFDs.Add(1) > maxTimerFDs {
		timerFDs.Add(-1)
		return nil
	}
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		timerFDs.Add(-1)
		return nil
	}
	return &timerFD{f: os.NewFile(uintptr(fd), "timerfd"), fd: fd}
}

// waitIO parks the calling goroutine for d, woken by the network poller.
func waitIO(d time.Duration) {
	t := getTimerFD()
	if t == nil {
		time.Sleep(d)
		return
	}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	var buf [8]byte
	if err := unix.TimerfdSettime(t.fd, 0, &spec, nil); err != nil {
		time.Sleep(d)
	} else if _, err := t.f.Read(buf[:]); err != nil {
		time.Sleep(d) // should not happen; keep the work honest anyway
	}
	freeTimerFDs <- t // never blocks: at most maxTimerFDs exist
}
