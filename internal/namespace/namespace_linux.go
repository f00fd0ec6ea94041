// Package namespace creates, opens and deletes named network namespaces
// (bind-mounted under /run/netns, where iproute2 finds them), wires veth
// pairs and bridges between them, and runs commands and sockets inside
// them. The lab builds its nodes with it and the connectivity probes their
// helper namespaces; tests use it through internal/testkit/nettest. It
// never changes the root namespace.
package namespace

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NamePrefix starts the name of every namespace this package creates, so
// that debris from a killed run can be found and removed (test/run.sh
// deletes what a killed run left).
const NamePrefix = "wefttest-"

// RunDir is where named namespaces are bind-mounted, as iproute2 expects.
const RunDir = "/run/netns"

// NS is a named network namespace.
type NS struct {
	Name string
	Path string
	// Handle is a netlink handle bound to the namespace; usable from any goroutine.
	Handle *netlink.Handle
}

// Create makes a namespace named NamePrefix+label+random suffix, with lo
// up. The caller must Delete it.
func Create(label string) (*NS, error) {
	var sfx [3]byte
	rand.Read(sfx[:])
	return CreateNamed(NamePrefix + label + "-" + hex.EncodeToString(sfx[:]))
}

// CreateNamed makes the namespace /run/netns/<name> (where iproute2 finds
// it) with lo up; it fails if the name exists. The caller must Delete it.
func CreateNamed(name string) (*NS, error) {
	if len(name) > 200 || strings.ContainsRune(name, '/') {
		return nil, fmt.Errorf("create netns %q: bad name", name)
	}
	if err := shareRunDir(); err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	path := filepath.Join(RunDir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	f.Close()
	// Unshare on a dedicated OS thread that is never given back to the Go
	// scheduler: the goroutine exits while locked, so the thread dies.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind mount %s: %w", path, err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	n, err := OpenNamed(name)
	if err != nil {
		deleteNamed(path)
		return nil, err
	}
	if err := SetUp(n, "lo"); err != nil {
		n.Delete()
		return nil, err
	}
	return n, nil
}

// shareRunDir makes RunDir a mount point with shared propagation, as
// iproute2 does before it binds its first namespace there. A namespace
// bound under it then appears in every mount namespace copied from this one
// afterwards (`ip netns exec`, a container runtime, unshare -m), also after
// that copy was made. Bound onto a plain directory instead, it would stay
// invisible in those copies, which would hold only the empty file. A lock
// on the directory keeps two creators from stacking two mounts; a RunDir
// that is already a mount point is only made shared.
func shareRunDir() error {
	if err := os.MkdirAll(RunDir, 0o755); err != nil {
		return err
	}
	dir, err := os.Open(RunDir)
	if err != nil {
		return err
	}
	defer dir.Close()
	if err := unix.Flock(int(dir.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", RunDir, err)
	}
	defer unix.Flock(int(dir.Fd()), unix.LOCK_UN)
	err = unix.Mount("", RunDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if !errors.Is(err, unix.EINVAL) {
		if err != nil {
			return fmt.Errorf("make %s shared: %w", RunDir, err)
		}
		return nil
	}
	// EINVAL: RunDir is not a mount point yet.
	if err := unix.Mount(RunDir, RunDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s onto itself: %w", RunDir, err)
	}
	if err := unix.Mount("", RunDir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", RunDir, err)
	}
	return nil
}

// OpenNamed opens the existing namespace /run/netns/<name> with a netlink
// handle bound to it; Delete or closing the Handle releases it.
func OpenNamed(name string) (*NS, error) {
	path := filepath.Join(RunDir, name)
	h, err := HandleAt(path)
	if err != nil {
		return nil, err
	}
	return &NS{Name: name, Path: path, Handle: h}, nil
}

// DeleteNamed unmounts and removes /run/netns/<name>. The namespace itself
// goes away once no process and no socket is left in it.
func DeleteNamed(name string) error {
	if err := deleteNamed(filepath.Join(RunDir, name)); err != nil {
		return fmt.Errorf("delete netns %s: %w", name, err)
	}
	return nil
}

// HandleAt returns a netlink handle bound to the namespace at path.
func HandleAt(path string) (*netlink.Handle, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	h, err := netlink.NewHandleAt(nsHandle(fd))
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", path, err)
	}
	return h, nil
}

// Delete kills every process still in the namespace that this process
// started (children only), then unmounts and removes it.
func (n *NS) Delete() error {
	if n.Handle != nil {
		n.Handle.Close()
		n.Handle = nil
	}
	return deleteNamed(n.Path)
}

func deleteNamed(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Do runs f on an OS thread switched into the namespace. Goroutines that f
// starts do not inherit the namespace; sockets and TAP fds opened inside f
// keep it.
func (n *NS) Do(f func() error) error {
	netns, err := ns.GetNS(n.Path)
	if err != nil {
		return err
	}
	defer netns.Close()
	return netns.Do(func(ns.NetNS) error { return f() })
}

// Command returns an exec.Cmd that runs argv inside the namespace (through
// `ip netns exec`, which also gives it its own /sys).
func (n *NS) Command(ctx context.Context, argv ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name}, argv...)...)
}

// Run runs argv inside the namespace and returns its combined output; a
// failure is an error that carries the output.
func (n *NS) Run(argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	cmd := n.Command(ctx, argv...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s in %s: %w: %s", strings.Join(argv, " "), n.Name, err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}
