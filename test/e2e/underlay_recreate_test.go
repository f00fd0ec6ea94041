package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestFlannel2247UnderlayRecreated answers flannel-io/flannel#2247 and
// k3s-io/k3s#12436 (the underlay is a device that goes away and comes back:
// tailscale0 when tailscaled restarts, a ZeroTier, VLAN or bond device
// recreated by the network manager; this kernel has no VLAN driver, so a
// veth to the underlay switch stands in for them): on n1 the underlay
// device eth0 is deleted and a new one made under its name, first with the
// same address and then with a new one; each time the
// pods must talk again both ways while the same weftd process keeps
// running, and its health server keeps answering, on vxlan, uvxlan (also
// with its files kept by a service manager) and host-gw.
func TestFlannel2247UnderlayRecreated(t *testing.T) {
	for _, backend := range []string{"vxlan", "uvxlan", "uvxlan-fdstore", "host-gw"} {
		t.Run(backend, func(t *testing.T) {
			typ := "vxlan"
			if backend == "host-gw" {
				typ = backend
			}
			// uvxlan-fdstore: weftd as systemd runs it with
			// FileDescriptorStoreMax=, its TAP queues and sockets kept by
			// the service manager across the node's runs.
			c := NewCluster(t, Options{Nodes: 0, Config: `{"Network":"10.244.0.0/16","Backend":{"Type":"` + typ + `"}}`,
				FDStore: backend == "uvxlan-fdstore"})
			var args []string
			if strings.HasPrefix(backend, "uvxlan") {
				args = []string{"--backend", "uvxlan"}
			}
			n1, n2 := c.AddNode("n1", args...), c.AddNode("n2", args...)
			n1.WaitReady()
			n2.WaitReady()
			a, b := n1.CNI.AddPod(t, "a"), n2.CNI.AddPod(t, "b")
			Eventually(t, 10*time.Second, "a reaches b", func() error { return Ping(a.NS, b.IP, "-W", "1") })
			pid := n1.PID()
			for i, addr := range []string{n1.Addr.String(), "192.168.77.102"} {
				t.Run("recreated with "+addr, func(t *testing.T) {
					nettest.MustRun(t, n1, "ip", "link", "del", "eth0")
					time.Sleep(500 * time.Millisecond)
					plugUnderlay(t, c, n1, fmt.Sprintf("p-n1-again%d", i), addr)
					took := Eventually(t, 20*time.Second, "pods talk again", func() error {
						if err := Ping(a.NS, b.IP, "-W", "1"); err != nil {
							return fmt.Errorf("a → b: %w", err)
						}
						return Ping(b.NS, a.IP, "-W", "1")
					})
					if err, ok := n1.Exited(0); ok {
						t.Fatalf("weftd on n1 exited (%v): the underlay's return must not need a restart", err)
					}
					if got := n1.PID(); got != pid {
						t.Fatalf("weftd on n1 is pid %d, was %d", got, pid)
					}
					// uvxlan's socket and TAP outlive the device with its
					// address: pods may talk again before weftd sees the new
					// device (every second) and starts the node on it.
					Eventually(t, 5*time.Second, "the node started again on the new device", func() error {
						log, _ := os.ReadFile(n1.LogFile)
						if got := strings.Count(string(log), "starting the node again"); got != i+1 {
							return fmt.Errorf("%d times in weftd's log, want %d", got, i+1)
						}
						return nil
					})
					// The health server kept listening across the node's
					// runs: kubelet's liveness probe never saw it gone.
					if log, _ := os.ReadFile(n1.LogFile); strings.Count(string(log), "serving health and metrics") != 1 {
						t.Errorf("weftd's health server started %d times, want once:\n%s",
							strings.Count(string(log), "serving health and metrics"), tail(string(log), 30))
					}
					// Ready again: the new run holds its sockets and
					// devices before the next case takes the device away.
					n1.WaitReady()
					if strings.HasPrefix(backend, "uvxlan") {
						// The new run's dataplane attached its fast path to
						// the new device.
						Eventually(t, 5*time.Second, "fast path attached", func() error {
							if v, err := n1.Metric("weft_dataplane_events_total", "event", "fastpath_attaches"); err != nil || v < 1 {
								return fmt.Errorf("weft_dataplane_events_total{event=fastpath_attaches} = %v (%v)", v, err)
							}
							return nil
						})
					}
					recordFailure(t, "2247", fmt.Sprintf("%s, recreated with %s: pods talk again %s after the underlay came back",
						backend, map[bool]string{true: "the same address", false: "a new address"}[i == 0], took.Round(time.Millisecond)))
				})
			}
		})
	}
}

// plugUnderlay gives n a new underlay device eth0 holding addr: a veth to
// the switch (whose end there is port), as a restarted tailscaled or
// network manager makes a new device under the old name.
func plugUnderlay(t *testing.T, c *Cluster, n *Node, port, addr string) {
	t.Helper()
	nettest.Veth(t, n.NS, "eth0", c.Underlay.NS, port)
	if err := namespace.Enslave(c.Underlay.NS, port, namespace.UnderlayBridge); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{
		"ip addr add " + addr + "/24 dev eth0",
		"ip route replace default via 192.168.77.254 dev eth0 onlink",
	} {
		nettest.MustRun(t, n, strings.Fields(cmd)...)
	}
}
