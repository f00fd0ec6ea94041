package policy

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestStoreProblem: a node without pods has no address store yet (the CNI
// plugin creates it with its first pod's address); that is no problem for
// the source checks, so a fresh node is not reported degraded. A missing
// store while a running pod has an address in the node's subnets is one,
// and so is any other error.
func TestStoreProblem(t *testing.T) {
	dir := t.TempDir()
	_, missing := PortsFromStore(filepath.Join(dir, "missing"))
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, notDir := PortsFromStore(file)
	if !errors.Is(missing, fs.ErrNotExist) || notDir == nil || errors.Is(notDir, fs.ErrNotExist) {
		t.Fatalf("PortsFromStore: missing %v, not a directory %v", missing, notDir)
	}
	pod := func(ip string, host bool, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{HostNetwork: host}, Status: corev1.PodStatus{Phase: phase, PodIP: ip}}
	}
	v4, v6 := netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:1::/64")
	for _, c := range []struct {
		name string
		err  error
		pods []*corev1.Pod
		want bool // a problem
	}{
		{"no pods", missing, nil, false},
		{"pods of other nodes, host-network and finished ones", missing, []*corev1.Pod{
			pod("10.244.2.5", false, corev1.PodRunning), pod("10.244.1.0", true, corev1.PodRunning),
			pod("10.244.1.7", false, corev1.PodSucceeded), pod("", false, corev1.PodPending)}, false},
		{"a pod of this node", missing, []*corev1.Pod{pod("10.244.1.5", false, corev1.PodRunning)}, true},
		{"an IPv6 pod of this node", missing, []*corev1.Pod{pod("fd00:1::9", false, corev1.PodRunning)}, true},
		{"not a directory", notDir, nil, true},
		{"read fine", nil, []*corev1.Pod{pod("10.244.1.5", false, corev1.PodRunning)}, false},
	} {
		if got := storeProblem(c.err, c.pods, v4, v6); (got != nil) != c.want {
			t.Errorf("%s: %v, want a problem: %v", c.name, got, c.want)
		}
	}
}
