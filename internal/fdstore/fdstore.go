// Package fdstore keeps a daemon's open files across its restarts with the
// service manager's file descriptor store, as systemd offers it
// (sd_notify(3): FDSTORE=1, FDNAME=, FDSTOREREMOVE=1; sd_listen_fds(3):
// LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES).
//
// weftd's userspace dataplane uses it for its TAP queues and its receive
// sockets: while the daemon restarts (also after SIGKILL) the service
// manager holds them open, so the kernel queues what arrives (frames routed
// to the TAP, datagrams for the VXLAN port) instead of dropping it, and the
// next weftd takes them over and drains the queues.
//
// Store is the daemon's side; it also sends the daemon's other
// notifications over the same socket (Notify: READY=1, STOPPING=1). Keeper
// is the service manager's side of the same protocol, for tests and the
// lab, which run weftd without systemd.
package fdstore

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// listenFDsStart is the first descriptor a service manager passes
// (SD_LISTEN_FDS_START).
const listenFDsStart = 3

// Store is the file descriptor store of a service, seen from the service.
// Files inherited from the last run are taken by name; files to keep are
// sent to the service manager under a name. Without a service manager
// (NOTIFY_SOCKET unset) nothing is inherited and Keep does nothing. A nil
// *Store is valid and behaves like one without a service manager. Its
// methods are safe for concurrent use.
type Store struct {
	log    *slog.Logger
	notify string // the service manager's socket; "" = none

	mu        sync.Mutex
	inherited map[string][]*os.File // not taken yet
}

// FromEnv returns the store of this process: the files the service manager
// passed (LISTEN_FDS with LISTEN_FDNAMES, when LISTEN_PID is this process)
// and its notification socket (NOTIFY_SOCKET). It clears those variables
// and marks the passed files close-on-exec, so that no child sees them.
func FromEnv(log *slog.Logger) (*Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{log: log, notify: os.Getenv("NOTIFY_SOCKET"), inherited: map[string][]*os.File{}}
	pid, fds, names := os.Getenv("LISTEN_PID"), os.Getenv("LISTEN_FDS"), os.Getenv("LISTEN_FDNAMES")
	for _, v := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", "NOTIFY_SOCKET"} {
		os.Unsetenv(v)
	}
	if pid == "" || fds == "" {
		return s, nil
	}
	if p, err := strconv.Atoi(pid); err != nil || p != os.Getpid() {
		return s, nil // meant for another process (a parent that exec'd us without clearing them)
	}
	n, err := strconv.Atoi(fds)
	if err != nil || n < 0 || n > 1024 {
		return s, fmt.Errorf("fdstore: LISTEN_FDS=%q is not a count of descriptors", fds)
	}
	var nameList []string
	if names != "" {
		nameList = strings.Split(names, ":")
	}
	for i := range n {
		fd := listenFDsStart + i
		unix.CloseOnExec(fd)
		name := "unknown" // what sd_listen_fds_with_names reports for a missing name
		if i < len(nameList) && nameList[i] != "" {
			name = nameList[i]
		}
		s.inherited[name] = append(s.inherited[name], os.NewFile(uintptr(fd), "fdstore:"+name))
	}
	return s, nil
}

// Enabled reports whether a service manager listens: whether Keep keeps.
func (s *Store) Enabled() bool { return s != nil && s.notify != "" }

// Take returns the file the last run stored under name and hands it to the
// caller, or nil when there is none. A name stored twice returns the first
// and closes the others.
func (s *Store) Take(name string) *os.File {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fs := s.inherited[name]
	delete(s.inherited, name)
	if len(fs) == 0 {
		return nil
	}
	for _, f := range fs[1:] {
		f.Close()
	}
	return fs[0]
}

// Unclaimed returns the names of the inherited files nobody took yet.
func (s *Store) Unclaimed() []string {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.inherited))
	for n := range s.inherited {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Keep asks the service manager to hold a duplicate of fd under name, in
// place of whatever it held under that name. The caller keeps fd.
func (s *Store) Keep(name string, fd int) error {
	if err := checkName(name); err != nil {
		return err
	}
	if !s.Enabled() {
		return nil
	}
	// FDPOLL=0: the manager must not drop a file on POLLHUP or POLLERR (a
	// TAP queue reports POLLERR while its device is briefly gone); weftd
	// replaces what went stale.
	msg := "FDSTOREREMOVE=1\nFDNAME=" + name + "\n"
	if err := s.send(msg, -1); err != nil {
		return err
	}
	return s.send("FDSTORE=1\nFDPOLL=0\nFDNAME="+name+"\n", fd)
}

// Notify sends state, newline-separated KEY=VALUE assignments such as
// "READY=1" (sd_notify(3)), to the service manager; without one it does
// nothing. FromEnv has cleared NOTIFY_SOCKET from the environment, so this
// is the process's only way to notify.
func (s *Store) Notify(state string) error {
	if !s.Enabled() {
		return nil
	}
	return s.send(state, -1)
}

// Release asks the service manager to close what it holds under name, and
// closes an inherited file of that name nobody took.
func (s *Store) Release(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if f := s.Take(name); f != nil {
		f.Close()
	}
	if !s.Enabled() {
		return nil
	}
	return s.send("FDSTOREREMOVE=1\nFDNAME="+name+"\n", -1)
}

// ReleaseUnclaimed releases every inherited name nobody took for which
// keep returns false (keep may be nil), and returns those names.
func (s *Store) ReleaseUnclaimed(keep func(name string) bool) ([]string, error) {
	var released []string
	var errs []error
	for _, n := range s.Unclaimed() {
		if keep != nil && keep(n) {
			continue
		}
		released = append(released, n)
		errs = append(errs, s.Release(n))
	}
	return released, errors.Join(errs...)
}

// send writes msg, and fd when not negative, to the notification socket.
func (s *Store) send(msg string, fd int) error {
	name := s.notify
	if strings.HasPrefix(name, "@") { // an abstract socket
		name = "\x00" + name[1:]
	}
	sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("fdstore: notify %s: %w", s.notify, err)
	}
	defer unix.Close(sock)
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	if err := unix.Sendmsg(sock, []byte(msg), oob, &unix.SockaddrUnix{Name: name}, 0); err != nil {
		return fmt.Errorf("fdstore: notify %s: %w", s.notify, err)
	}
	return nil
}

// checkName applies systemd's rule for FDNAME: 1–255 printable ASCII
// characters without ':'.
func checkName(name string) error {
	if name == "" || len(name) > 255 {
		return fmt.Errorf("fdstore: name %q: must be 1 to 255 characters", name)
	}
	for _, c := range []byte(name) {
		if c <= ' ' || c >= 0x7f || c == ':' {
			return fmt.Errorf("fdstore: name %q: only printable ASCII without ':' or spaces", name)
		}
	}
	return nil
}
