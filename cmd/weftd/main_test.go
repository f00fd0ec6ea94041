package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestHelpAndVersion runs the weftd binary: --help and -h print the usage
// and exit 0 (not "flag: help requested" and 1), --version prints it.
func TestHelpAndVersion(t *testing.T) {
	bin := nettest.Binary(t, "weftd")
	for _, arg := range []string{"--help", "-h"} {
		out, err := exec.Command(bin, arg).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "-etcd-endpoints") || strings.Contains(string(out), "help requested") {
			t.Errorf("weftd %s: %v:\n%s", arg, err, out)
		}
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "weftd ") {
		t.Errorf("weftd --version: %v: %q", err, out)
	}
	out, err = exec.Command(bin, "--no-such-flag").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "no-such-flag") {
		t.Errorf("weftd with an unknown flag: %v:\n%s", err, out)
	}
}

// TestKubeModeRunsWeftdKube: this build has no Kubernetes client. With
// --kube-subnet-mgr it runs weftd-kube from its own directory (found
// through a symbolic link, as /opt/bin/flanneld in the image), which then
// does the work; without weftd-kube there it says what is missing.
func TestKubeModeRunsWeftdKube(t *testing.T) {
	weftd := nettest.Binary(t, "weftd")
	kube := filepath.Join(filepath.Dir(weftd), "weftd-kube")
	args := []string{"--kube-subnet-mgr", "--node-name", "n1", "--kubeconfig", "/nonexistent/kubeconfig"}

	alone := t.TempDir()
	copyFile(t, weftd, filepath.Join(alone, "weftd"))
	out, err := exec.Command(filepath.Join(alone, "weftd"), args...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "needs weftd-kube") || !strings.Contains(string(out), filepath.Join(alone, "weftd-kube")) {
		t.Errorf("weftd without weftd-kube: %v:\n%s", err, out)
	}

	both := t.TempDir()
	copyFile(t, weftd, filepath.Join(both, "weftd"))
	copyFile(t, kube, filepath.Join(both, "weftd-kube"))
	link := filepath.Join(t.TempDir(), "flanneld")
	if err := os.Symlink(filepath.Join(both, "weftd"), link); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(link, args...).CombinedOutput()
	// weftd-kube started (it logs that it has the client) and failed on
	// the missing kubeconfig, as flanneld: it was started under that name.
	if err == nil || !strings.Contains(string(out), "kubernetesClient=true") || !strings.Contains(string(out), "/nonexistent/kubeconfig") ||
		!strings.Contains(string(out), "flannelCompat=true") {
		t.Errorf("weftd --kube-subnet-mgr with weftd-kube beside it: %v:\n%s", err, out)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}
