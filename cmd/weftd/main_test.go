package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/weft-net/weft/internal/nettest"
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
