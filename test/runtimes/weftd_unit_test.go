package runtimes

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
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
// iptables-legacy, write its forward accepts there. uvxlan's fast path, on
// by default, attaches with the unit's capabilities; with CAP_BPF taken
// from them weftd says why once and the userspace path carries the
// traffic to a peer.
func TestWeftdWithUnitCapabilities(t *testing.T) {
	unit := filepath.Join(nettest.ModuleRoot(t), "dist", "weftd.service")
	// systemd joins the lines of CapabilityBoundingSet= (CAP_BPF has one
	// of its own, which an old systemd that does not know it ignores).
	lines := unitValues(t, unit, "CapabilityBoundingSet")
	if len(lines) == 0 {
		t.Fatalf("%s: no CapabilityBoundingSet=", unit)
	}
	caps := []string{strings.Join(lines, " ")}
	bits := map[string]uint{"CAP_NET_BIND_SERVICE": 10, "CAP_NET_BROADCAST": 11, "CAP_NET_ADMIN": 12, "CAP_NET_RAW": 13, "CAP_SYS_ADMIN": 21, "CAP_BPF": 39}
	if !slices.Contains(strings.Fields(caps[0]), "CAP_BPF") {
		t.Errorf("%s: CapabilityBoundingSet=%s has no CAP_BPF, which uvxlan's fast path (on by default) needs", unit, caps[0])
	}
	if slices.ContainsFunc(lines, func(l string) bool { f := strings.Fields(l); return slices.Contains(f, "CAP_BPF") && len(f) > 1 }) {
		t.Errorf("%s: CAP_BPF shares a CapabilityBoundingSet= line with others: a systemd that does not know it would drop them all", unit)
	}
	c := e2e.NewCluster(t, e2e.Options{})
	peer := c.AddNode("peer") // kernel VXLAN, all capabilities
	peer.WaitReady()
	for _, tc := range []struct {
		name, backend string
		legacy        bool   // the host's firewall is iptables-legacy, its FORWARD policy DROP
		without       string // a capability of the unit's taken away
	}{{"vxlan", "vxlan", false, ""}, {"uvxlan", "uvxlan", false, ""}, {"iptables-legacy", "vxlan", true, ""},
		{"uvxlan without CAP_BPF", "uvxlan", false, "CAP_BPF"}} {
		backend := tc.backend
		t.Run(tc.name, func(t *testing.T) {
			bounding, mask := "-all", uint64(0)
			for _, c := range strings.Fields(caps[0]) {
				b, ok := bits[c]
				if !ok {
					t.Fatalf("%s: capability %s unknown to this test", unit, c)
				}
				if c == tc.without {
					continue
				}
				bounding += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
				mask |= 1 << b
			}
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
				t.Errorf("weftd does not run with exactly %s (%s):\n%s", bounding, want, status)
			}
			if backend == "uvxlan" {
				checkFastPath(t, h, peer, log, tc.without == "")
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

// checkFastPath pings peer's VTEP address from h, whose weftd runs uvxlan
// with the fast path on (the default), and checks who carried it: the fast
// path when attached is true; else the userspace path, weftd having said
// once why the fast path is unavailable.
func checkFastPath(t *testing.T, h *nettest.Host, peer *e2e.Node, log string, attached bool) {
	t.Helper()
	if err := e2e.Ping(h.NS, peer.Subnet().Addr(), "-c", "3", "-i", "0.2"); err != nil {
		t.Fatalf("ping %s (peer's VTEP) from the uvxlan host: %v\n%s", peer.Subnet().Addr(), err, tailFile(log, 30))
	}
	ev := func(name string) (float64, bool) {
		_, body, err := h.HTTPGet("http://127.0.0.1:9470/metrics")
		if err != nil {
			t.Fatalf("/metrics: %v", err)
		}
		m := regexp.MustCompile(`(?m)^weft_dataplane_events_total\{event="` + name + `"\} (\S+)$`).FindStringSubmatch(body)
		if m == nil {
			return 0, false
		}
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return v, true
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	said := strings.Count(string(b), "fast path unavailable; using the userspace path only")
	attaches, _ := ev("fastpath_attaches")
	tx, _ := ev("fastpath_tx_frames")
	unavailable, reported := ev("fastpath_unavailable")
	if attached {
		if attaches < 1 || tx < 1 || reported || said != 0 {
			t.Errorf("with the unit's capabilities: fastpath_attaches %v, fastpath_tx_frames %v, fastpath_unavailable reported %v, "+
				"unavailable said %d times: want the fast path attached and carrying the ping\n%s", attaches, tx, reported, said, tailFile(log, 30))
		}
		return
	}
	if unavailable != 1 || attaches != 0 || tx != 0 {
		t.Errorf("without CAP_BPF: fastpath_unavailable %v, fastpath_attaches %v, fastpath_tx_frames %v: want unavailable, nothing attached",
			unavailable, attaches, tx)
	}
	if said != 1 || !strings.Contains(string(b), "operation not permitted") {
		t.Errorf("without CAP_BPF weftd said %d times that the fast path is unavailable, want once with the reason:\n%s", said, tailFile(log, 30))
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
