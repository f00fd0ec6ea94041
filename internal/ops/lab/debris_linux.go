package lab

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/weft-net/weft/internal/namespace"
	"golang.org/x/sys/unix"
)

// Down stops the lab of state directory dir. A live `lab up` is sent
// SIGTERM (after its identity is checked) and does its own teardown; Down
// waits for it, and if it does not finish within the timeout kills it.
// Whatever is left then (or all of it, when the lab had died) is removed
// here: recorded processes, namespaces with the lab's prefix, state files.
func Down(dir string, timeout time.Duration, log *slog.Logger) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("lab down: %w", err)
	}
	if !Exists(dir) {
		return fmt.Errorf("lab down: %w in %s (no lab.json, lock or %s* namespace)", ErrNoLab, dir, Prefix(dir))
	}
	if Running(dir) {
		st, err := LoadState(dir)
		if err != nil {
			return fmt.Errorf("lab down: a lab holds %s but its state is unreadable: %w", dir, err)
		}
		if !st.Proc.Alive() {
			return fmt.Errorf("lab down: the lock of %s is held but pid %d is not the lab that wrote lab.json", dir, st.Proc.PID)
		}
		log.Info("stopping lab", "pid", st.Proc.PID)
		stopProc(st.Proc, timeout, log)
	}
	lk, err := tryLock(dir)
	if err != nil {
		return fmt.Errorf("lab down: %w", err)
	}
	defer lk.release()
	err = sweepLocked(dir, log)
	os.Remove(filepath.Join(dir, "lock"))
	os.Remove(dir) // only when empty
	return err
}

// Exists reports whether anything of a lab with state directory dir is
// left: its state file, its lock file or one of its namespaces.
func Exists(dir string) bool {
	for _, f := range []string{stateFile, "lock"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return true
		}
	}
	names, _ := ownedNamespaces(Prefix(dir))
	return len(names) > 0
}

// Sweep removes the debris of a dead lab in dir, refusing with ErrRunning
// while a live one holds it.
func Sweep(dir string, log *slog.Logger) error {
	lk, err := tryLock(dir)
	if err != nil {
		return err
	}
	defer lk.release()
	return sweepLocked(dir, log)
}

// sweepLocked removes everything a dead lab of dir left; the caller holds
// dir's lock.
func sweepLocked(dir string, log *slog.Logger) error {
	err := sweepState(dir, Prefix(dir), log)
	return errors.Join(err, removeFiles(dir))
}

// sweepState stops the processes recorded in dir's lab.json that are still
// the ones the lab started, then any process left inside one of the lab's
// namespaces whose command line names a path under dir (only the lab
// starts such processes), then deletes every namespace with the prefix.
func sweepState(dir, prefix string, log *slog.Logger) error {
	var errs []error
	if st, err := LoadState(dir); err == nil {
		if st.Proc.PID != os.Getpid() && st.Proc.Alive() {
			log.Warn("stopping the process of a dead lab", "pid", st.Proc.PID)
			stopProc(st.Proc, 5*time.Second, log)
		}
		for _, n := range st.Nodes {
			if n.Weftd.Alive() {
				log.Warn("stopping a leftover weftd", "node", n.Name, "pid", n.Weftd.PID)
				stopProc(n.Weftd, 5*time.Second, log)
			}
		}
	} else if !errors.Is(err, ErrNoLab) {
		errs = append(errs, err)
	}
	names, err := ownedNamespaces(prefix)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, p := range procsInNamespaces(names, dir) {
		log.Warn("stopping a leftover process in a lab namespace", "pid", p.PID)
		stopProc(p, 5*time.Second, log)
	}
	for _, name := range names {
		log.Info("deleting namespace", "netns", name)
		errs = append(errs, deleteNS(name))
	}
	return errors.Join(errs...)
}

// stopProc sends SIGTERM to p, waits up to timeout for it to go, then
// SIGKILL. Each signal is sent only after p.Alive() proved the PID is
// still the recorded process.
func stopProc(p Proc, timeout time.Duration, log *slog.Logger) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if !p.Alive() {
			return
		}
		if err := syscall.Kill(p.PID, sig); err != nil {
			log.Warn("signal", "pid", p.PID, "signal", sig, "err", err)
		}
		for end := time.Now().Add(timeout); time.Now().Before(end) && p.Alive(); {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// procsInNamespaces finds processes whose network namespace is one of the
// named ones and whose command line holds an argument under dir.
func procsInNamespaces(names []string, dir string) []Proc {
	inodes := map[uint64]bool{}
	for _, n := range names {
		var st unix.Stat_t
		if unix.Stat(filepath.Join(namespace.RunDir, n), &st) == nil {
			inodes[st.Ino] = true
		}
	}
	if len(inodes) == 0 {
		return nil
	}
	entries, _ := os.ReadDir("/proc")
	var out []Proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			continue
		}
		ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "net:["), "]"), 10, 64)
		if err != nil || !inodes[ino] {
			continue
		}
		argv, err := procCmdline(pid)
		if err != nil {
			continue
		}
		for _, a := range argv {
			if strings.HasPrefix(a, dir+"/") {
				if p, err := IdentifyProc(pid, a); err == nil {
					out = append(out, p)
				}
				break
			}
		}
	}
	return out
}
