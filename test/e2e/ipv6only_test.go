package e2e

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// ipv6OnlyConfig is an IPv6-only network: no IPv4 network at all.
const ipv6OnlyConfig = `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}`

// TestIPv6Only runs an IPv6-only cluster (etcd mode) on an IPv6-only
// underlay, on vxlan and uvxlan: each pod gets an IPv6 address only, and
// TCP crosses between pods on the two nodes both ways.
func TestIPv6Only(t *testing.T) {
	for _, backend := range []string{"vxlan", "uvxlan"} {
		t.Run(backend, func(t *testing.T) {
			c := NewCluster(t, Options{Nodes: 0, UnderlayV6: netip.MustParsePrefix("fd77::/64"), Config: ipv6OnlyConfig})
			c.OnNode = func(n *Node) { ipv6OnlyUnderlay(t, n.NS) }
			var args []string
			if backend == "uvxlan" {
				args = []string{"--backend", "uvxlan"}
			}
			n1, n2 := c.AddNode("n1", args...), c.AddNode("n2", args...)
			n1.WaitReady()
			n2.WaitReady()
			// uvxlan's one TAP has the plain name; kernel vxlan names its
			// IPv6 device apart.
			dev, absent := "weft-v6.1", device
			if backend == "uvxlan" {
				dev, absent = "weft-u.1", "weft-u6.1"
			}
			checkOverlayDevices(t, n1, dev, absent)
			checkIPv6OnlyPods(t, n1, n2)
		})
	}
}

// checkOverlayDevices checks that n has the overlay device dev with the
// IPv6 overlay's MTU (1500 less 70 bytes of IPv6 VXLAN headers) and no
// device absent.
func checkOverlayDevices(t *testing.T, n *Node, dev, absent string) {
	t.Helper()
	links := nettest.MustRun(t, n, "ip", "-o", "link", "show")
	if !strings.Contains(links, " "+dev+": ") ||
		strings.Contains(links, " "+absent+": ") || !strings.Contains(nettest.MustRun(t, n, "ip", "link", "show", dev), " mtu 1430 ") {
		t.Errorf("%s: want the IPv6 overlay device %s with MTU 1430 and no %s:\n%s", n.Label, dev, absent, links)
	}
}

// ipv6OnlyUnderlay takes the IPv4 address and routes off a host's eth0, so
// that its underlay is IPv6 only.
func ipv6OnlyUnderlay(t *testing.T, ns *nettest.NS) {
	t.Helper()
	nettest.MustRun(t, ns, "ip", "-4", "addr", "flush", "dev", "eth0")
	nettest.MustRun(t, ns, "ip", "-6", "route", "add", "default", "via", "fd77::ffff", "dev", "eth0", "onlink")
}

// checkIPv6OnlyPods adds a pod on each node, checks that each has an IPv6
// address and no IPv4 one, and sends TCP between them both ways.
func checkIPv6OnlyPods(t *testing.T, n1, n2 *Node) {
	t.Helper()
	a, b := n1.CNI.AddPod(t, "a"), n2.CNI.AddPod(t, "b")
	for _, p := range []struct {
		name string
		ns   *nettest.NS
	}{{"a", a.NS}, {"b", b.NS}} {
		if out := nettest.MustRun(t, p.ns, "ip", "-4", "-o", "addr", "show", "dev", "eth0"); strings.TrimSpace(out) != "" {
			t.Errorf("pod %s has an IPv4 address on an IPv6-only network:\n%s", p.name, out)
		}
	}
	a6, b6 := podIPv6(t, a), podIPv6(t, b)
	for _, d := range []struct {
		name string
		src  *nettest.NS
		dst  *nettest.NS
		ip   netip.Addr
	}{{"n1 → n2", a.NS, b.NS, b6}, {"n2 → n1", b.NS, a.NS, a6}} {
		// A new pod's address is usable once duplicate address detection
		// is over.
		Eventually(t, 10*time.Second, d.name+" ping", func() error { return Ping(d.src, d.ip, "-W", "1") })
		rate, err := Transfer(d.src, d.dst, d.ip, 10<<20)
		if err != nil {
			t.Fatalf("TCP %s: %v", d.name, err)
		}
		t.Logf("TCP %s: 10 MiB at %.2f Gb/s", d.name, rate*8/1e9)
	}
}
