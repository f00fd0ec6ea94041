package lab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/internal/nettest"
)

// createNS makes the named namespace /run/netns/<name> (iproute2's place, so
// `ip netns exec` finds it) with lo up. It fails if the name exists.
func createNS(name string) (*nettest.NS, error) {
	if err := os.MkdirAll(nettest.RunDir, 0o755); err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	path := filepath.Join(nettest.RunDir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	f.Close()
	// Unshare on an OS thread that is never given back to the scheduler:
	// the goroutine ends while locked, so the thread (now in the new
	// namespace) exits with it.
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind mount: %w", err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	n, err := OpenNS(name)
	if err != nil {
		deleteNS(name)
		return nil, err
	}
	if err := nettest.SetUp(n, "lo"); err != nil {
		n.Handle.Close()
		deleteNS(name)
		return nil, err
	}
	return n, nil
}

// OpenNS opens an existing named namespace with a netlink handle bound to
// it; the caller closes the handle.
func OpenNS(name string) (*nettest.NS, error) {
	path := filepath.Join(nettest.RunDir, name)
	h, err := nettest.HandleAt(path)
	if err != nil {
		return nil, err
	}
	return &nettest.NS{Name: name, Path: path, Handle: h}, nil
}

// deleteNS unmounts and removes /run/netns/<name>. The namespace itself
// goes away once no process is left in it.
func deleteNS(name string) error {
	path := filepath.Join(nettest.RunDir, name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete netns %s: unmount: %w", name, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete netns %s: %w", name, err)
	}
	return nil
}

// ownedNamespaces lists the names under /run/netns that the lab with the
// given prefix made.
func ownedNamespaces(prefix string) ([]string, error) {
	entries, err := os.ReadDir(nettest.RunDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w", err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) && OwnsNamespace(prefix, e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}
