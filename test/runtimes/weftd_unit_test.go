package runtimes

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/test/e2e"
)

// TestWeftdWithUnitCapabilities runs weftd on a host as dist/weftd.service
// does: root, with only the unit's CapabilityBoundingSet and no new
// privileges (setpriv stands in for systemd, which does not run here). With
// either dataplane it must get its lease, write the subnet file, turn
// forwarding on and become ready; on a host whose firewall is
// iptables-legacy, write its forward accepts there.
func TestWeftdWithUnitCapabilities(t *testing.T) {
	unit := filepath.Join(nettest.ModuleRoot(t), "dist", "weftd.service")
	caps := unitValues(t, unit, "CapabilityBoundingSet")
	if len(caps) != 1 {
		t.Fatalf("%s: want one CapabilityBoundingSet=, got %q", unit, caps)
	}
	bits := map[string]uint{"CAP_NET_BIND_SERVICE": 10, "CAP_NET_BROADCAST": 11, "CAP_NET_ADMIN": 12, "CAP_NET_RAW": 13, "CAP_SYS_ADMIN": 21}
	bounding, mask := "-all", uint64(0)
	for _, c := range strings.Fields(caps[0]) {
		b, ok := bits[c]
		if !ok {
			t.Fatalf("%s: capability %s unknown to this test", unit, c)
		}
		bounding += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
		mask |= 1 << b
	}
	c := e2e.NewCluster(t, e2e.Options{})
	for _, tc := range []struct {
		name, backend string
		legacy        bool // the host's firewall is iptables-legacy, its FORWARD policy DROP
	}{{"vxlan", "vxlan", false}, {"uvxlan", "uvxlan", false}, {"iptables-legacy", "vxlan", true}} {
		backend := tc.backend
		t.Run(tc.name, func(t *testing.T) {
			h := c.Underlay.AddHost(t, "cap"+tc.name[:1], "eth0")
			nettest.MustRun(t, h, "sysctl", "-qw", "net.ipv4.ip_forward=0")
			if tc.legacy {
				nettest.MustRun(t, h, "iptables-legacy", "-P", "FORWARD", "DROP")
			}
			file := filepath.Join(t.TempDir(), "subnet.env")
			log := filepath.Join(t.TempDir(), "weftd.log")
			cmd, done := startCapped(t, h, bounding, log, "--etcd-endpoints", c.Etcd.Endpoint,
				"--subnet-file", file, "--iface", "eth0", "--backend", backend)
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
			want := fmt.Sprintf("%016x", mask)
			if !strings.Contains(string(status), "\nCapBnd:\t"+want+"\n") || !strings.Contains(string(status), "\nCapEff:\t"+want+"\n") {
				t.Errorf("weftd does not run with exactly %s (%s):\n%s", caps[0], want, status)
			}
			if _, err := subnet.ReadFile(file); err != nil {
				t.Errorf("subnet file: %v", err)
			}
			if fwd := strings.TrimSpace(nettest.MustRun(t, h, "cat", "/proc/sys/net/ipv4/ip_forward")); fwd != "1" {
				t.Errorf("ip_forward is %s after weftd started, want 1", fwd)
			}
			if tc.legacy {
				e2e.Eventually(t, 10*time.Second, "WEFT-FWD in iptables-legacy's FORWARD", func() error {
					if out := nettest.MustRun(t, h, "iptables-legacy", "-S", "FORWARD"); !strings.Contains(out, "-A FORWARD -j WEFT-FWD") {
						return fmt.Errorf("iptables-legacy -S FORWARD:\n%s\nweftd:\n%s", out, tailFile(log, 10))
					}
					return nil
				})
			}
		})
	}
}

// startCapped starts weftd in h under setpriv with the given bounding set,
// logging to log, and stops it when the test ends.
func startCapped(t *testing.T, h *nettest.Host, bounding, log string, args ...string) (*exec.Cmd, chan error) {
	t.Helper()
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	argv := append([]string{"setpriv", "--bounding-set", bounding, "--inh-caps", "-all", "--no-new-privs", e2e.Binary(t)}, args...)
	cmd := h.Command(context.Background(), argv...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); f.Close() }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return cmd, done
}
