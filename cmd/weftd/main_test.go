package main

import (
	"context"
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

// TestKubeModeOneBinary: the one weftd has the Kubernetes registry. Started
// as flanneld (a symbolic link, as /opt/bin/flanneld in the image) with
// --kube-subnet-mgr, it takes flanneld's defaults, says it has the client,
// and fails on the missing kubeconfig.
func TestKubeModeOneBinary(t *testing.T) {
	weftd := nettest.Binary(t, "weftd")
	link := filepath.Join(t.TempDir(), "flanneld")
	if err := os.Symlink(weftd, link); err != nil {
		t.Fatal(err)
	}
	ns := nettest.NewNS(t, "weftd") // nothing it does reaches the root namespace
	out, err := ns.Command(context.Background(), link, "--kube-subnet-mgr", "--node-name", "n1", "--kubeconfig", "/nonexistent/kubeconfig").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "kubernetesClient=true") || !strings.Contains(string(out), "/nonexistent/kubeconfig") ||
		!strings.Contains(string(out), "flannelCompat=true") {
		t.Errorf("weftd --kube-subnet-mgr as flanneld: %v:\n%s", err, out)
	}
}

// TestNoKubeBuild: a build with -tags weft_nokube leaves client-go out and
// refuses --kube-subnet-mgr with a message that names the standard build.
func TestNoKubeBuild(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "weftd")
	build := exec.Command("go", "build", "-tags", "weft_nokube", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags weft_nokube: %v\n%s", err, out)
	}
	deps, err := exec.Command("go", "list", "-tags", "weft_nokube", "-deps", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(deps), "k8s.io/client-go") {
		t.Error("the weft_nokube build links k8s.io/client-go")
	}
	ns := nettest.NewNS(t, "weftd")
	out, err := ns.Command(context.Background(), bin, "--kube-subnet-mgr", "--node-name", "n1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "weft_nokube") || !strings.Contains(string(out), "kubernetesClient=false") {
		t.Errorf("weft_nokube weftd --kube-subnet-mgr: %v:\n%s", err, out)
	}
}
