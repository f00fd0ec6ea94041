package kubecluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/weft-net/weft/internal/namespace"
)

// Down stops the cluster whose state is in dir and removes all it made:
// every process (pods, containerd and its shims, kubelets, kube-proxies,
// the control plane, the forwarder), the nodes' cgroups, every namespace
// whose name starts with its prefix, and dir itself; it restores the
// sysctls kubelet changed when no other cluster runs. A cluster that Up
// left half-built is swept by its names.
func Down(dir string) error {
	s, err := LoadState(dir)
	if errors.Is(err, ErrNoCluster) {
		s, err = &State{Dir: dir}, nil
	}
	if err != nil {
		return err
	}
	var errs []error
	// Kubelets first, so that nothing restarts what goes next.
	for _, d := range s.Procs {
		if strings.HasSuffix(d.Name, "-kubelet") {
			stopProc(d.Proc, 5*time.Second)
		}
	}
	names, nets, mnts, cgroups := s.footprint()
	// Pods, shims, containerd, kube-proxy and the holders: everything in a
	// node's cgroup, mount namespace or network namespace.
	killAll(procsWhere(func(pid int) bool {
		return inCgroup(pid, cgroups) || inNamespace(pid, "mnt", mnts) || inNamespace(pid, "net", nets)
	}), 10*time.Second)
	// The control plane, newest first.
	for i := len(s.Procs) - 1; i >= 0; i-- {
		stopProc(s.Procs[i].Proc, 5*time.Second)
	}
	for _, cg := range cgroups {
		if err := removeCgroup(cg); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range names {
		if err := namespace.DeleteNamed(filepath.Base(p)); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, releaseSysctls(dir, s.Sysctls))
	errs = append(errs, unmountUnder(dir))
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, fmt.Errorf("kubecluster: remove %s: %w", dir, err))
	}
	return errors.Join(errs...)
}

// footprint lists what the cluster made: its namespaces (paths) and their
// inodes, the inodes of its nodes' mount namespaces, and its cgroups.
func (s *State) footprint() (names []string, nets, mnts map[uint64]bool, cgroups []string) {
	mnts = map[uint64]bool{}
	for _, n := range s.Nodes {
		if n.Holder.Alive() {
			if ino, err := nsInode(fmt.Sprintf("/proc/%d/ns/mnt", n.Holder.PID)); err == nil {
				mnts[ino] = true
			}
		}
	}
	names = s.owned(func(prefix string) []string {
		found, _ := filepath.Glob(netnsPath(prefix + "*"))
		return found
	})
	for _, n := range s.Namespaces {
		if p := netnsPath(n); !slices.Contains(names, p) {
			if _, err := os.Stat(p); err == nil {
				names = append(names, p)
			}
		}
	}
	nets = map[uint64]bool{}
	for _, p := range names {
		if ino, err := nsInode(p); err == nil {
			nets[ino] = true
		}
	}
	cgroups = append([]string{}, s.Cgroups...)
	for _, f := range s.owned(globCgroups) {
		if cg := "/" + filepath.Base(f); !slices.Contains(cgroups, cg) {
			cgroups = append(cgroups, cg)
		}
	}
	return names, nets, mnts, cgroups
}

// unmountUnder detaches any mount of the caller's mount namespace under
// dir (none is expected: nodes mount only in their own namespaces).
func unmountUnder(dir string) error {
	var errs []error
	for _, mp := range mountsMatching(func(mp, _ string) bool { return mp == dir || strings.HasPrefix(mp, dir+"/") }) {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("kubecluster: unmount %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// mountsMatching lists the mount points of the caller's mount namespace
// for which match(mount point, source) holds, deepest first.
func mountsMatching(match func(mp, source string) bool) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		f, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(tail) < 2 {
			continue
		}
		if match(f[4], f[3]+" "+tail[1]) {
			out = append([]string{f[4]}, out...)
		}
	}
	return out
}

// owned applies glob to the cluster's name prefix (none for a state
// without one).
func (s *State) owned(glob func(prefix string) []string) []string {
	if s.Prefix == "" {
		return nil
	}
	return glob(s.Prefix)
}

// globCgroups lists the cgroup directories, in every hierarchy, whose names
// start with prefix.
func globCgroups(prefix string) []string {
	var out []string
	for _, h := range cgroupHierarchies() {
		found, _ := filepath.Glob(filepath.Join(h, prefix+"*"))
		out = append(out, found...)
	}
	return out
}

// Leftovers reports what the cluster called name that was in dir left on
// the machine: namespaces or cgroups named with its prefix, processes in
// such cgroups or running a program from dir, mounts under dir or of its
// files, dir itself, and sysctls whose values differ from before (a
// snapshot taken with Sysctls before Up); while other clusters' kubelets
// run, kubelet's sysctls are compared by the values recorded for when the
// last of them stops.
func Leftovers(dir, name string, before []Sysctl) error {
	var errs []error
	prefix := NamePrefix(name)
	if names, _ := filepath.Glob(netnsPath(prefix + "*")); len(names) > 0 {
		errs = append(errs, fmt.Errorf("namespaces left: %v", names))
	}
	cgroups := globCgroups(prefix)
	if len(cgroups) > 0 {
		errs = append(errs, fmt.Errorf("cgroups left: %v", cgroups))
	}
	var roots []string
	for _, c := range cgroups {
		roots = append(roots, "/"+filepath.Base(c))
	}
	procs := procsWhere(func(pid int) bool {
		if len(roots) > 0 && inCgroup(pid, roots) {
			return true
		}
		args, err := cmdline(pid)
		return err == nil && strings.Contains(strings.Join(args, " "), dir+"/")
	})
	if len(procs) > 0 {
		errs = append(errs, fmt.Errorf("processes left: %v", procs))
	}
	if m := mountsMatching(func(mp, src string) bool {
		return strings.HasPrefix(mp, dir) || strings.Contains(src, dir) || strings.Contains(mp, prefix)
	}); len(m) > 0 {
		errs = append(errs, fmt.Errorf("mounts left: %v", m))
	}
	if _, err := os.Stat(dir); err == nil {
		errs = append(errs, fmt.Errorf("state directory %s left", dir))
	}
	held := othersHold()
	for _, sc := range before {
		v, err := readSysctl(sc.Name)
		if saved, ok := held[sc.Name]; ok {
			// Another cluster's kubelets run: the value goes back to the
			// one recorded before the first of them started.
			v = saved
		}
		if err != nil || v != sc.Value {
			errs = append(errs, fmt.Errorf("sysctl %s is %q, was %q (%v)", sc.Name, v, sc.Value, err))
		}
	}
	return errors.Join(errs...)
}

// othersHold returns the kubelet sysctls' recorded values when clusters
// still running hold them (nil when none does).
func othersHold() map[string]string {
	held := map[string]string{}
	withRecord(func(r *sysctlHolders) error {
		if len(r.Holders) > 0 {
			for _, sc := range r.Saved {
				held[sc.Name] = sc.Value
			}
		}
		return nil
	})
	return held
}

// WatchedSysctls are the machine's sysctls a cluster must leave as they
// were: kubelet's three (which Down restores) and the root network
// namespace's that kube-proxy, kubelet or a CNI plugin would set if they
// ran there.
var WatchedSysctls = append(append([]string{}, kubeletSysctls...),
	"net/netfilter/nf_conntrack_max", "net/netfilter/nf_conntrack_tcp_timeout_established",
	"net/netfilter/nf_conntrack_tcp_timeout_close_wait", "net/ipv4/ip_forward",
	"net/ipv4/conf/all/route_localnet", "net/bridge/bridge-nf-call-iptables")

// Sysctls reads the names (paths under /proc/sys); one that does not exist
// is left out.
func Sysctls(names []string) []Sysctl {
	var out []Sysctl
	for _, n := range names {
		if v, err := readSysctl(n); err == nil {
			out = append(out, Sysctl{Name: n, Value: v})
		}
	}
	return out
}
