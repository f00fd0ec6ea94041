package kubecluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// inotifyPerNode and inotifyControlPlane are the inotify instances a
// cluster's processes hold, as counted on running clusters: kubelet 6 and
// containerd 1 per node; kube-apiserver 3 and kube-controller-manager 5.
const (
	inotifyPerNode      = 7
	inotifyControlPlane = 8
)

// checkInotify fails, before anything is started, when the inotify
// instances the machine still grants this user (fs.inotify.max_user_instances,
// shared by every cluster and program of the user) are too few for a
// cluster of nodes: containerd's CRI plugin and kubelet's cAdvisor fail
// without one, minutes into the bring-up.
func checkInotify(nodes int) error {
	b, err := os.ReadFile("/proc/sys/fs/inotify/max_user_instances")
	if err != nil {
		return nil // no limit to read: let the bring-up say
	}
	limit, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil
	}
	used := inotifyInUse(os.Geteuid())
	need := nodes*inotifyPerNode + inotifyControlPlane
	if limit-used < need {
		return fmt.Errorf("kubecluster: too few inotify instances left for %d nodes: %d of fs.inotify.max_user_instances=%d are in use (other clusters?), a cluster needs about %d; take other clusters down or raise the limit",
			nodes, used, limit, need)
	}
	return nil
}

// inotifyInUse counts the inotify instances open in the processes of uid.
func inotifyInUse(uid int) int {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	n := 0
	for _, p := range procs {
		var st syscall.Stat_t
		if syscall.Stat(p, &st) == nil && int(st.Uid) == uid {
			n += inotifyOf(p)
		}
	}
	return n
}

// inotifyOf counts the inotify instances open in the process of proc
// (a /proc/PID directory).
func inotifyOf(proc string) int {
	fds, _ := filepath.Glob(filepath.Join(proc, "fd", "*"))
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && l == "anon_inode:inotify" {
			n++
		}
	}
	return n
}
