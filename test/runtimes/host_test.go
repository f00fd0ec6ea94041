package runtimes

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weft-net/weft/test/e2e"
)

// rtHost is a test host (a weftd node of an e2e.Cluster) prepared for a
// container runtime: a long-lived holder process in the host's network
// namespace and in a private mount namespace of its own, where the
// machine's cgroup hierarchies are mounted again (`ip netns exec` hides
// them under a fresh /sys) and /run (and /var/lib for podman) are private
// tmpfs mounts, so the runtime's state (runc, shims, CNI caches) never
// meets the machine's or another host's. Daemons and commands enter the
// holder's namespaces with nsenter.
type rtHost struct {
	*e2e.Node
	t       *testing.T
	Dir     string   // the runtime's state directory on the real file system
	Cgroup  string   // cgroup parent of every container, e.g. /wefttest-n1-1a2b3c
	Env     []string // added to the environment of every command
	holder  *exec.Cmd
	daemons []*daemon
}

// newRTHost prepares node n for a runtime. privateVarLib also gives
// /var/lib a private tmpfs (podman keeps caches there whatever --root says).
// The directory of the node's subnet file is bind-mounted on /run/flannel,
// where weftd writes it on a real host. extra is more shell for the
// prelude, run after those mounts.
func newRTHost(t *testing.T, n *e2e.Node, privateVarLib bool, extra string) *rtHost {
	t.Helper()
	h := &rtHost{Node: n, t: t, Dir: t.TempDir(), Cgroup: "/" + n.Name}
	prelude, err := mountPrelude(privateVarLib)
	if err != nil {
		t.Fatal(err)
	}
	prelude += fmt.Sprintf("mkdir -p /run/flannel && mount --bind %s /run/flannel\n", filepath.Dir(n.SubnetFile)) + extra
	h.holder = n.Command(context.Background(), "sh", "-c", prelude+"exec sleep infinity")
	h.holder.Stderr = os.Stderr
	if err := h.holder.Start(); err != nil {
		t.Fatalf("start the holder of %s: %v", n.Label, err)
	}
	t.Cleanup(h.cleanup)
	// The holder is ready once sleep runs: its command line says so.
	e2e.Eventually(t, 10*time.Second, "holder mounts on "+n.Label, func() error {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", h.holder.Process.Pid))
		if err != nil || !strings.HasPrefix(string(b), "sleep\x00") {
			return fmt.Errorf("holder not ready (%q, %v)", b, err)
		}
		return nil
	})
	h.checkNamespaces(h.holder.Process.Pid, "the holder")
	return h
}

// mountPrelude is the shell that sets up the private mounts: it mirrors the
// machine's cgroup mounts (v1 hierarchies or the v2 tree) and mounts tmpfs
// on /run (and /var/lib).
func mountPrelude(privateVarLib bool) (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	var b strings.Builder
	b.WriteString("set -e\n")
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID parent maj:min root mountpoint options ... - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(tail) < 3 {
			continue
		}
		mp, fstype := fields[4], tail[0]
		if mp != "/sys/fs/cgroup" && !strings.HasPrefix(mp, "/sys/fs/cgroup/") {
			continue
		}
		opts := tail[2]
		if fstype == "cgroup" {
			opts = cgroupV1Opts(opts)
		}
		fmt.Fprintf(&b, "mkdir -p %s && mount -t %s -o %s %s %s\n", mp, fstype, opts, fstype, mp)
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	b.WriteString("mount -t tmpfs -o mode=755 tmpfs /run\n")
	if privateVarLib {
		b.WriteString("mount -t tmpfs -o mode=755 tmpfs /var/lib\n")
	}
	return b.String(), nil
}

// cgroupV1Opts keeps the controller options of a v1 hierarchy (cpu,
// name=systemd, …), dropping the generic ones.
func cgroupV1Opts(opts string) string {
	var keep []string
	for _, o := range strings.Split(opts, ",") {
		switch o {
		case "rw", "ro", "nosuid", "nodev", "noexec", "relatime":
		default:
			keep = append(keep, o)
		}
	}
	return strings.Join(keep, ",")
}

// Cmd returns a command that runs argv inside the holder's network and
// mount namespaces (nsenter execs it in place: its PID is argv's).
func (h *rtHost) Cmd(ctx context.Context, argv ...string) *exec.Cmd {
	args := append([]string{"-t", strconv.Itoa(h.holder.Process.Pid), "-m", "-n", "--"}, argv...)
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	cmd.Env = append(os.Environ(), h.Env...)
	return cmd
}

// Run runs argv in the holder's namespaces and returns its output.
func (h *rtHost) Run(argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := h.Cmd(ctx, argv...)
	b, err := cmd.CombinedOutput()
	if err != nil {
		return string(b), fmt.Errorf("%s on %s: %w: %s", strings.Join(argv, " "), h.Label, err, strings.TrimSpace(string(b)))
	}
	return string(b), nil
}

// Output runs argv in the holder's namespaces and returns its standard
// output; standard error goes into the error.
func (h *rtHost) Output(argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stderr strings.Builder
	cmd := h.Cmd(ctx, argv...)
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return string(b), fmt.Errorf("%s on %s: %w: %s%s", strings.Join(argv, " "), h.Label, err, b, strings.TrimSpace(stderr.String()))
	}
	return string(b), nil
}

// MustRun is Run that fails the test on error.
func (h *rtHost) MustRun(argv ...string) string {
	h.t.Helper()
	out, err := h.Run(argv...)
	if err != nil {
		h.t.Fatal(err)
	}
	return out
}

// checkNamespaces fails the test unless pid is in the host's network
// namespace and not in the test's mount namespace.
func (h *rtHost) checkNamespaces(pid int, what string) {
	h.t.Helper()
	want, err1 := os.Stat(h.Path)
	got, err2 := os.Stat(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err := errors.Join(err1, err2); err != nil {
		h.t.Fatalf("%s on %s: %v", what, h.Label, err)
	}
	if !os.SameFile(want, got) {
		h.t.Fatalf("%s (pid %d) is not in %s's network namespace", what, pid, h.Label)
	}
	ours, _ := os.Readlink("/proc/self/ns/mnt")
	theirs, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if ours == theirs {
		h.t.Fatalf("%s (pid %d) shares the test's mount namespace", what, pid)
	}
}

// daemon is a long-running runtime process started in the holder.
type daemon struct {
	name string
	cmd  *exec.Cmd
	done chan error
	log  string
}

// StartDaemon starts argv in the holder's namespaces, logging to a file,
// and checks where it runs.
func (h *rtHost) StartDaemon(name string, argv ...string) *daemon {
	h.t.Helper()
	d := &daemon{name: name, log: filepath.Join(h.Dir, name+".log"), done: make(chan error, 1)}
	f, err := os.Create(d.log)
	if err != nil {
		h.t.Fatal(err)
	}
	d.cmd = h.Cmd(context.Background(), argv...)
	d.cmd.Stdout, d.cmd.Stderr = f, f
	if err := d.cmd.Start(); err != nil {
		f.Close()
		h.t.Fatalf("start %s on %s: %v", name, h.Label, err)
	}
	go func() { d.done <- d.cmd.Wait(); f.Close() }()
	h.daemons = append(h.daemons, d)
	// nsenter enters the namespaces, then execs argv in place.
	h.WaitFor(d, 10*time.Second, "nsenter to exec "+argv[0], func() error {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", d.cmd.Process.Pid))
		if err != nil || !strings.HasPrefix(string(b), argv[0]+"\x00") {
			return fmt.Errorf("not yet (%q, %v)", b, err)
		}
		return nil
	})
	h.checkNamespaces(d.cmd.Process.Pid, name)
	return d
}

// WaitFor polls cond until it succeeds; it fails early if the daemon exits.
func (h *rtHost) WaitFor(d *daemon, timeout time.Duration, what string, cond func() error) {
	h.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		select {
		case werr := <-d.done:
			d.done <- werr
			h.t.Fatalf("%s on %s exited (%v) while waiting for %s:\n%s", d.name, h.Label, werr, what, tailFile(d.log, 30))
		default:
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s on %s: %s not within %s: %v\n%s", d.name, h.Label, what, timeout, err, tailFile(d.log, 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}

// cleanup stops the daemons (SIGTERM, then SIGKILL), kills what is left in
// the holder's mount namespace (shims, conmon) and in the containers' cgroup
// parent, removes those cgroups and stops the holder.
func (h *rtHost) cleanup() {
	for i := len(h.daemons) - 1; i >= 0; i-- {
		d := h.daemons[i]
		d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(20 * time.Second):
			d.cmd.Process.Kill()
			<-d.done
		}
		if h.t.Failed() {
			h.t.Logf("%s log on %s:\n%s", d.name, h.Label, tailFile(d.log, 40))
		}
	}
	if h.holder.Process != nil {
		killMountNS(h.holder.Process.Pid)
		killCgroup(h.Cgroup)
		h.holder.Process.Kill()
		h.holder.Wait()
	}
	removeCgroup(h.Cgroup)
}

// killMountNS SIGKILLs every process except pid itself that shares pid's
// mount namespace.
func killMountNS(pid int) {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil || p == pid {
			continue
		}
		if other, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", p)); err == nil && other == ns {
			syscall.Kill(p, syscall.SIGKILL)
		}
	}
}

// cgroupDirs lists the directories of cgroup path in every hierarchy
// mounted under /sys/fs/cgroup.
func cgroupDirs(path string) []string {
	var out []string
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", path, "cgroup.procs")); err == nil {
		out = append(out, filepath.Join("/sys/fs/cgroup", path)) // a v2 tree
	}
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range ents {
		d := filepath.Join("/sys/fs/cgroup", e.Name(), path)
		if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// killCgroup SIGKILLs every process in the cgroup subtree.
func killCgroup(path string) {
	for _, root := range cgroupDirs(path) {
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			return nil
		})
	}
}

// removeCgroup removes the cgroup subtree, deepest first, retrying while
// killed processes exit.
func removeCgroup(path string) {
	deadline := time.Now().Add(10 * time.Second)
	for _, root := range cgroupDirs(path) {
		var dirs []string
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			for os.Remove(dirs[i]) != nil && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
}
