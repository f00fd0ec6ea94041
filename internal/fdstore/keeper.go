package fdstore

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Keeper is the service manager's side of the store: a notification socket
// that takes FDSTORE=1, FDNAME= and FDSTOREREMOVE=1 messages and holds the
// files, and the LISTEN_* hand-over when it starts the service again. It is
// what systemd does for a unit with FileDescriptorStoreMax=, for tests and
// the lab, which start weftd themselves. Other messages (READY=1, STATUS=)
// are read and ignored.
type Keeper struct {
	path string
	fd   int
	done chan struct{}
	wg   sync.WaitGroup

	mu    sync.Mutex
	names []string // in the order first stored, as systemd passes them
	files map[string][]int
	err   error // the first malformed message
}

// NewKeeper listens on a socket named notify.sock in dir.
func NewKeeper(dir string) (*Keeper, error) {
	path := filepath.Join(dir, "notify.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("fdstore keeper: socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("fdstore keeper: bind %s: %w", path, err)
	}
	k := &Keeper{path: path, fd: fd, done: make(chan struct{}), files: map[string][]int{}}
	k.wg.Go(k.loop)
	return k, nil
}

// Socket is the path to put in the service's NOTIFY_SOCKET.
func (k *Keeper) Socket() string { return k.path }

// loop reads messages as they come, so a service never blocks on a full
// socket queue.
func (k *Keeper) loop() {
	for {
		select {
		case <-k.done:
			return
		default:
		}
		unix.Poll([]unix.PollFd{{Fd: int32(k.fd), Events: unix.POLLIN}}, 100)
		k.mu.Lock()
		k.drain()
		k.mu.Unlock()
	}
}

// drain handles every message waiting on the socket. k.mu is held, so
// messages are applied in the order they were sent.
func (k *Keeper) drain() {
	buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4*16))
	for {
		n, oobn, _, _, err := unix.Recvmsg(k.fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err != nil {
			return // EAGAIN: nothing more
		}
		fds, err := rights(oob[:oobn])
		if err == nil {
			err = k.apply(string(buf[:n]), fds)
		}
		if err != nil && k.err == nil {
			k.err = err
		}
	}
}

func rights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("fdstore keeper: control message: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		if fs, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, fs...)
		}
	}
	return fds, nil
}

// apply runs one message: the fields are newline-separated KEY=VALUE.
func (k *Keeper) apply(msg string, fds []int) error {
	var store, remove bool
	name := "stored" // systemd's name for a file stored without FDNAME
	for _, line := range strings.Split(msg, "\n") {
		key, val, _ := strings.Cut(line, "=")
		switch key {
		case "FDSTORE":
			store = val == "1"
		case "FDSTOREREMOVE":
			remove = val == "1"
		case "FDNAME":
			if err := checkName(val); err != nil {
				closeAll(fds)
				return err
			}
			name = val
		}
	}
	if remove {
		closeAll(k.files[name])
		delete(k.files, name)
		k.names = slices.DeleteFunc(k.names, func(n string) bool { return n == name })
	}
	if !store {
		closeAll(fds)
		return nil
	}
	if _, ok := k.files[name]; !ok {
		k.names = append(k.names, name)
	}
	k.files[name] = append(k.files[name], fds...)
	return nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// Names returns the names held, one per file, in the order they are passed.
func (k *Keeper) Names() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.drain()
	var out []string
	for _, n := range k.names {
		for range k.files[n] {
			out = append(out, n)
		}
	}
	return out
}

// Err returns the first malformed message the keeper received, if any.
func (k *Keeper) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// Prepare sets cmd up as a service manager starts a service: NOTIFY_SOCKET,
// and the held files as descriptors 3, 4, … with LISTEN_FDS and
// LISTEN_FDNAMES. LISTEN_PID must be the service's own PID, which is known
// only after the fork, so cmd must run the service through a shell that
// sets it (Wrap). Call the returned function after cmd.Start: it closes
// the parent's copies.
func (k *Keeper) Prepare(cmd *exec.Cmd) (func(), error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.drain() // what was sent before the service died
	var files []*os.File
	var names []string
	for _, n := range k.names {
		for _, fd := range k.files[n] {
			dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
			if err != nil {
				for _, f := range files {
					f.Close()
				}
				return nil, fmt.Errorf("fdstore keeper: dup %s: %w", n, err)
			}
			files = append(files, os.NewFile(uintptr(dup), n))
			names = append(names, n)
		}
	}
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, "NOTIFY_SOCKET="+k.path)
	if len(files) > 0 {
		if len(cmd.ExtraFiles) > 0 {
			return nil, errors.New("fdstore keeper: cmd already has extra files")
		}
		cmd.ExtraFiles = files
		cmd.Env = append(cmd.Env, "LISTEN_FDS="+strconv.Itoa(len(files)), "LISTEN_FDNAMES="+strings.Join(names, ":"))
	}
	return func() {
		for _, f := range files {
			f.Close()
		}
	}, nil
}

// Wrap returns argv run through /bin/sh, which sets LISTEN_PID to its own
// PID and then execs argv in its place (the PID stays).
func Wrap(argv []string) []string {
	return append([]string{"/bin/sh", "-c", `LISTEN_PID=$$ exec "$@"`, "sh"}, argv...)
}

// Close stops reading and closes every file held.
func (k *Keeper) Close() {
	close(k.done)
	k.wg.Wait()
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, fds := range k.files {
		closeAll(fds)
	}
	k.files, k.names = map[string][]int{}, nil
	unix.Close(k.fd)
	os.Remove(k.path)
}

// WaitFor waits until the keeper holds a file under each of names or
// timeout passes, and reports whether it does.
func (k *Keeper) WaitFor(timeout time.Duration, names ...string) bool {
	for deadline := time.Now().Add(timeout); ; time.Sleep(10 * time.Millisecond) {
		have := k.Names()
		if !slices.ContainsFunc(names, func(n string) bool { return !slices.Contains(have, n) }) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}
