package lab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ErrRunning is returned when a live `lab up` holds the state directory.
var ErrRunning = errors.New("a lab is running")

// lock is the exclusive flock on <state>/lock that a `lab up` process holds
// for its whole life; the kernel drops it when the process dies, however it
// dies, so a held lock always means a live lab.
type lock struct{ f *os.File }

// tryLock takes the lock or fails with ErrRunning.
func tryLock(dir string) (*lock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("state dir lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w with state dir %s: run `weftctl lab down` (or --state-dir another directory)", ErrRunning, dir)
		}
		return nil, fmt.Errorf("state dir lock: %w", err)
	}
	return &lock{f: f}, nil
}

func (l *lock) release() { l.f.Close() }

// Running reports whether a live `lab up` holds dir.
func Running(dir string) bool {
	if _, err := os.Stat(filepath.Join(dir, "lock")); err != nil {
		return false
	}
	l, err := tryLock(dir)
	if err != nil {
		return errors.Is(err, ErrRunning)
	}
	l.release()
	return false
}
