package kubecluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/weft-net/weft/internal/ops/lab"
)

// startDaemon starts argv detached from the caller (a session of its own,
// so that it outlives Up), logging to <Dir>/logs/<name>.log, and records
// it. enter is a command prefix that switches namespaces and then execs
// argv in place (nsenter does), so the PID is argv's. marker is an argument
// of argv unique to this daemon, checked before any signal (see lab.Proc).
func (s *State) startDaemon(name string, enter, argv []string, marker string) (lab.Proc, error) {
	logs := filepath.Join(s.Dir, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return lab.Proc{}, fmt.Errorf("kubecluster: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(logs, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return lab.Proc{}, fmt.Errorf("kubecluster: start %s: %w", name, err)
	}
	defer f.Close()
	full := append(append([]string{}, enter...), argv...)
	cmd := exec.Command(full[0], full[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return lab.Proc{}, fmt.Errorf("kubecluster: start %s: %w", name, err)
	}
	pid := cmd.Process.Pid
	go cmd.Wait() // reap it if it dies while this process still runs
	// Wait for the prefix to exec argv (which may exec further).
	for end := time.Now().Add(10 * time.Second); ; {
		args, err := cmdline(pid)
		if err != nil && !running(pid) {
			return lab.Proc{}, fmt.Errorf("kubecluster: %s exited at once: %w (log: %s)", name, err, logTail(s.Dir, name))
		}
		// (An empty command line while it runs: it is in the middle of an exec.)
		if err == nil {
			if b := filepath.Base(args[0]); b != "nsenter" && b != "unshare" && b != "env" {
				break
			}
		}
		if time.Now().After(end) {
			return lab.Proc{}, fmt.Errorf("kubecluster: %s: %s did not exec %s (it runs %q)", name, enter[0], argv[0], args)
		}
		time.Sleep(20 * time.Millisecond)
	}
	p, err := lab.IdentifyProc(pid, marker)
	if err != nil {
		return lab.Proc{}, fmt.Errorf("kubecluster: %s: %w (log: %s)", name, err, logTail(s.Dir, name))
	}
	s.Procs = append(s.Procs, Daemon{Name: name, Proc: p})
	return p, s.save()
}

func cmdline(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, err
	}
	s := strings.TrimRight(string(b), "\x00")
	if s == "" {
		return nil, errors.New("no command line (exited)")
	}
	return strings.Split(s, "\x00"), nil
}

// logTail returns the end of a daemon's log.
func logTail(dir, name string) string {
	b, err := os.ReadFile(filepath.Join(dir, "logs", name+".log"))
	if err != nil {
		return err.Error()
	}
	const max = 3000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// stopProc sends SIGTERM, waits up to timeout, then SIGKILL, each signal
// only while p is still the recorded process.
func stopProc(p lab.Proc, timeout time.Duration) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if !p.Alive() {
			return
		}
		syscall.Kill(p.PID, sig)
		for end := time.Now().Add(timeout); time.Now().Before(end) && p.Alive(); {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// nsInode returns the inode of a namespace file (/proc/<pid>/ns/<kind> or a
// bind mount of one).
func nsInode(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// procsWhere lists the PIDs (other than this process's) for which match
// holds.
func procsWhere(match func(pid int) bool) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if match(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// inNamespace reports whether pid's namespace of kind ("net", "mnt") has
// one of the inodes.
func inNamespace(pid int, kind string, inodes map[uint64]bool) bool {
	ino, err := nsInode(fmt.Sprintf("/proc/%d/ns/%s", pid, kind))
	return err == nil && inodes[ino]
}

// inCgroup reports whether pid is in a cgroup under one of roots (in any
// hierarchy).
func inCgroup(pid int, roots []string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, r := range roots {
			if parts[2] == r || strings.HasPrefix(parts[2], r+"/") {
				return true
			}
		}
	}
	return false
}

// killAll SIGKILLs the processes and waits (up to timeout) until they are
// gone.
func killAll(pids []int, timeout time.Duration) {
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	for end := time.Now().Add(timeout); time.Now().Before(end); {
		alive := false
		for _, pid := range pids {
			alive = alive || running(pid)
		}
		if !alive {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// running reports whether pid exists and is not a zombie.
func running(pid int) bool {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return err == nil && !zombie(string(st))
}

func zombie(stat string) bool {
	i := strings.LastIndexByte(stat, ')')
	return i < 0 || strings.HasPrefix(strings.TrimSpace(stat[i+1:]), "Z")
}
