package kubecluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// kubeletSysctls are the machine-wide sysctls kubelet sets (and fails
// without): Up saves them before the first kubelet starts, Down restores
// them.
var kubeletSysctls = []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"}

func readSysctl(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", name))
	if err != nil {
		return "", fmt.Errorf("kubecluster: read sysctl: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// sysctlRecord is the machine-wide record of the kubelet sysctls' values
// before the first of the running clusters started its kubelets, and of
// the clusters (their state directories) running since: the last one
// down restores the values.
const sysctlRecord = "/run/weft-kubecluster-sysctls.json"

type sysctlHolders struct {
	Saved   []Sysctl `json:"saved"`
	Holders []string `json:"holders"`
}

// withRecord runs f on the record under a lock on /run, then writes it
// back, or removes it when no cluster holds it.
func withRecord(f func(r *sysctlHolders) error) error {
	lock, err := os.Open("/run")
	if err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("kubecluster: lock /run: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	var r sysctlHolders
	if b, err := os.ReadFile(sysctlRecord); err == nil {
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("kubecluster: %s: %w", sysctlRecord, err)
		}
	}
	// Clusters whose state is gone hold nothing.
	r.Holders = slices.DeleteFunc(r.Holders, func(d string) bool {
		_, err := os.Stat(stateFile(d))
		return err != nil
	})
	if err := f(&r); err != nil {
		return err
	}
	if len(r.Holders) == 0 {
		if err := os.Remove(sysctlRecord); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("kubecluster: %w", err)
		}
		return nil
	}
	return writeJSON(sysctlRecord, r)
}

// saveSysctls records the kubelet sysctls' values before this cluster's
// kubelets start: the machine's own, or, when other clusters run (or ran
// and were killed), the values recorded before theirs.
func (s *State) saveSysctls() error {
	err := withRecord(func(r *sysctlHolders) error {
		// A record no running cluster holds is a killed cluster's: its
		// values are still the machine's own.
		if len(r.Saved) == 0 {
			for _, name := range kubeletSysctls {
				v, err := readSysctl(name)
				if err != nil {
					return err
				}
				r.Saved = append(r.Saved, Sysctl{Name: name, Value: v})
			}
		}
		if !slices.Contains(r.Holders, s.Dir) {
			r.Holders = append(r.Holders, s.Dir)
		}
		s.Sysctls = r.Saved
		return nil
	})
	if err != nil {
		return err
	}
	return s.save()
}

// releaseSysctls drops the cluster in dir from the record and, when no
// other cluster runs, restores the recorded values (own, this cluster's
// copy, when there is no record).
func releaseSysctls(dir string, own []Sysctl) error {
	return withRecord(func(r *sysctlHolders) error {
		had := len(r.Holders) > 0 || len(r.Saved) > 0
		r.Holders = slices.DeleteFunc(r.Holders, func(d string) bool { return d == dir })
		if len(r.Holders) > 0 {
			return nil
		}
		saved := r.Saved
		if !had {
			saved = own
		}
		return restoreSysctls(saved)
	})
}

// restoreSysctls writes the saved values back and checks them.
func restoreSysctls(saved []Sysctl) error {
	var errs []error
	for _, sc := range saved {
		if err := os.WriteFile(filepath.Join("/proc/sys", sc.Name), []byte(sc.Value), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("kubecluster: restore %s=%s: %w", sc.Name, sc.Value, err))
			continue
		}
		if v, err := readSysctl(sc.Name); err != nil || v != sc.Value {
			errs = append(errs, fmt.Errorf("kubecluster: %s is %q after restoring %q (%v)", sc.Name, v, sc.Value, err))
		}
	}
	return errors.Join(errs...)
}

// cgroupHierarchies lists the mounted cgroup hierarchies: each v1
// controller's directory under /sys/fs/cgroup (and the v2 tree mounted
// among them), or /sys/fs/cgroup itself on a v2-only machine.
func cgroupHierarchies() []string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.procs"); err == nil {
		return []string{"/sys/fs/cgroup"}
	}
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, e := range ents {
		d := filepath.Join("/sys/fs/cgroup", e.Name())
		if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// makeCgroup creates a node's cgroupRoot in every hierarchy; a new cpuset
// cgroup gets its parent's CPUs and memory nodes (it is empty otherwise
// and takes no task).
func makeCgroup(path string) error {
	for _, h := range cgroupHierarchies() {
		d := filepath.Join(h, path)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("kubecluster: cgroup %s: %w", d, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if v, err := os.ReadFile(filepath.Join(h, f)); err == nil {
				if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
					return fmt.Errorf("kubecluster: %s/%s: %w", d, f, err)
				}
			}
		}
	}
	return nil
}

// cgroupProcs lists the PIDs in the cgroup subtree path, in every
// hierarchy.
func cgroupProcs(path string) []int {
	var pids []int
	for _, h := range cgroupHierarchies() {
		filepath.WalkDir(filepath.Join(h, path), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				var pid int
				if _, err := fmt.Sscan(f, &pid); err == nil {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// removeCgroup removes the cgroup subtree path in every hierarchy, deepest
// first, retrying while killed processes leave it.
func removeCgroup(path string) error {
	var errs []error
	deadline := time.Now().Add(15 * time.Second)
	for _, h := range cgroupHierarchies() {
		root := filepath.Join(h, path)
		var dirs []string
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			for {
				err := os.Remove(dirs[i])
				if err == nil || errors.Is(err, os.ErrNotExist) {
					break
				}
				if time.Now().After(deadline) {
					errs = append(errs, fmt.Errorf("kubecluster: remove cgroup %s: %w", dirs[i], err))
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	return errors.Join(errs...)
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("kubecluster: encode %s: %w", path, err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	return nil
}
