package runtimes

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/nettest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/test/e2e"
)

// TestWeftdWithUnitCapabilities runs weftd on a host as dist/weftd.service
// does: root, with only the unit's CapabilityBoundingSet and no new
// privileges (setpriv stands in for systemd, which does not run here). It
// must get its lease, write the subnet file, turn forwarding on and become
// ready.
func TestWeftdWithUnitCapabilities(t *testing.T) {
	unit := filepath.Join(nettest.ModuleRoot(t), "dist", "weftd.service")
	caps := unitValues(t, unit, "CapabilityBoundingSet")
	if len(caps) != 1 {
		t.Fatalf("%s: want one CapabilityBoundingSet=, got %q", unit, caps)
	}
	bounding := "-all"
	for _, c := range strings.Fields(caps[0]) {
		bounding += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
	}
	c := e2e.NewCluster(t, e2e.Options{})
	h := c.Underlay.AddHost(t, "capd", "eth0")
	h.MustRun(t, "sysctl", "-qw", "net.ipv4.ip_forward=0")
	file := filepath.Join(t.TempDir(), "subnet.env")
	log := filepath.Join(t.TempDir(), "weftd.log")
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := h.Command(context.Background(), "setpriv", "--bounding-set", bounding, "--inh-caps", "-all", "--no-new-privs",
		e2e.Binary(t), "--etcd-endpoints", c.Etcd.Endpoint, "--subnet-file", file, "--iface", "eth0")
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	e2e.Eventually(t, 30*time.Second, "weftd ready with "+bounding, func() error {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("weftd exited: %v\n%s", err, tailFile(log, 30))
		default:
		}
		if code, _, err := h.HTTPGet("http://127.0.0.1:9470/readyz"); err != nil || code != 200 {
			return fmt.Errorf("readyz: %d %v", code, err)
		}
		return nil
	})
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(status), "\nCapBnd:\t0000000000003000\n") || !strings.Contains(string(status), "\nCapEff:\t0000000000003000\n") {
		t.Errorf("weftd runs with other capabilities than CAP_NET_ADMIN and CAP_NET_RAW (0x3000):\n%s", status)
	}
	if _, err := subnet.ReadFile(file); err != nil {
		t.Errorf("subnet file: %v", err)
	}
	if fwd := strings.TrimSpace(h.MustRun(t, "cat", "/proc/sys/net/ipv4/ip_forward")); fwd != "1" {
		t.Errorf("ip_forward is %s after weftd started, want 1", fwd)
	}
}
