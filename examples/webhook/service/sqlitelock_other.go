//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package service

import "os"

// flockExclusive: no advisory lock on this platform (a second process on
// the same SQLite file is not refused here).
func flockExclusive(*os.File) (held bool, err error) { return false, nil }
