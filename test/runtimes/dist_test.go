package runtimes

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestDistUnits runs `systemd-analyze verify` on dist/weftd.service and on
// Debian's docker.service with dist's drop-in, in a scratch root that holds
// the machine's systemd units and every program the units execute (weftd
// and weftctl freshly built). Any warning fails the test, not only errors.
func TestDistUnits(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		nettest.CannotRun(t, nettest.SkipTools, "systemd-analyze is not installed (test/setup.sh installs systemd)")
	}
	if _, err := os.Stat("/lib/systemd/system/docker.service"); err != nil {
		nettest.CannotRun(t, nettest.SkipTools, "docker.io is not installed (test/setup.sh installs it)")
	}
	dist := filepath.Join(nettest.ModuleRoot(t), "dist")
	root := t.TempDir()
	put := func(dst, src string, mode os.FileMode) {
		t.Helper()
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, dst)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, mode); err != nil {
			t.Fatal(err)
		}
	}
	units, err := filepath.Glob("/lib/systemd/system/*")
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range units {
		if st, err := os.Stat(u); err == nil && st.Mode().IsRegular() {
			put(filepath.Join("lib/systemd/system", filepath.Base(u)), u, 0o644)
		}
	}
	put("etc/systemd/system/weftd.service", filepath.Join(dist, "weftd.service"), 0o644)
	put("etc/systemd/system/docker.service.d/10-weft.conf", filepath.Join(dist, "docker.service.d", "10-weft.conf"), 0o644)
	put("usr/local/bin/weftd", nettest.Binary(t, "weftd"), 0o755)
	put("usr/local/bin/weftctl", nettest.Binary(t, "weftctl"), 0o755)
	for _, p := range []string{"/usr/sbin/dockerd", "/bin/sh", "/bin/kill", "/bin/touch"} {
		put(p[1:], p, 0o755)
	}
	out, err := exec.Command("systemd-analyze", "verify", "--root="+root, "weftd.service", "docker.service").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestDistConflist checks that dist's conflist is what the runtimes in
// these tests read: a cniVersion that Podman 4.3's and containerd 1.6's
// libcni accept (with 1.1.0, Podman 4.3 finds no network "weft" and
// containerd 1.6 refuses the result version), weft first, the subnet file where
// weftd writes it.
func TestDistConflist(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(nettest.ModuleRoot(t), "dist", "10-weft.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		CNIVersion string           `json:"cniVersion"`
		Name       string           `json:"name"`
		Plugins    []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if c.CNIVersion != "1.0.0" || c.Name != "weft" || len(c.Plugins) == 0 || c.Plugins[0]["type"] != "weft" ||
		c.Plugins[0]["subnetFile"] != "/run/flannel/subnet.env" {
		t.Errorf("dist/10-weft.conflist: %s", b)
	}
}
