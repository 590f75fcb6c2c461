//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package service

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// flockExclusive takes an exclusive flock on f without waiting; held
// reports that another open file holds it.
func flockExclusive(f *os.File) (held bool, err error) {
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if errors.Is(err, unix.EWOULDBLOCK) {
		return true, nil
	}
	return false, err
}
