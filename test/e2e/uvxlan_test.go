package e2e

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
)

// TestMixedBackends runs a kernel VXLAN node and a userspace (uvxlan) node
// without the fast path ("FastPath": false) in one cluster through the real
// weftd: pods reach each other both ways and a transfer arrives intact; the
// uvxlan node's counters move, its userspace path taking the kernel peer's
// partial checksums (the fast path leaves them to the receiving stack).
func TestMixedBackends(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 0, Config: `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","FastPath":false}}`})
	k := c.AddNode("kern")
	u := c.AddNode("user", "--backend", "uvxlan")
	k.WaitReady()
	u.WaitReady()
	// Both nodes keep the default offloads of their veth: the kernel node
	// leaves inner checksums partial, and the uvxlan node must take them.
	if out := nettest.MustRun(t, u, "ip", "-d", "link", "show", "weft-u.1"); !strings.Contains(out, "tun") {
		t.Fatalf("uvxlan node has no TAP device:\n%s", out)
	}
	a, b := k.CNI.AddPod(t, "a"), u.CNI.AddPod(t, "b")
	if err := Ping(a.NS, b.IP); err != nil {
		t.Errorf("kernel → userspace: %v", err)
	}
	if err := Ping(b.NS, a.IP); err != nil {
		t.Errorf("userspace → kernel: %v", err)
	}
	for _, dir := range []struct {
		name     string
		src, dst *plugintest.Pod
	}{{"kernel → userspace", a, b}, {"userspace → kernel", b, a}} {
		rate, err := Transfer(dir.src.NS, dir.dst.NS, dir.dst.IP, 50<<20)
		if err != nil {
			t.Fatalf("%s: %v", dir.name, err)
		}
		t.Logf("50 MiB %s at %.2f Gb/s", dir.name, rate*8/1e9)
	}
	if err := Ping(a.NS, b.IP, "-M", "do", "-s", "1422"); err != nil {
		t.Errorf("DF ping at the MTU: %v", err)
	}
	if err := Ping(a.NS, b.IP, "-M", "do", "-s", "1423"); err == nil {
		t.Error("DF ping above the MTU crossed")
	}
	if v, err := u.Metric("weft_dataplane_events_total", "event", "partial_checksum"); err != nil || v < 1 {
		t.Errorf("weft_dataplane_events_total{event=partial_checksum} = %v (%v), want the kernel peer's partial checksums counted", v, err)
	}
	// Both dataplanes report frames through the same metric: uvxlan counts
	// its own, the kernel backend reports its device's counters.
	for _, n := range []*Node{u, k} {
		for _, dir := range []string{"tx", "rx"} {
			v, err := n.Metric("weft_dataplane_frames_total", "direction", dir)
			if err != nil || v < 1000 {
				t.Errorf("%s: weft_dataplane_frames_total{direction=%q} = %v (%v), want it to count the transfer", n.Label, dir, v, err)
			}
		}
	}
}

// TestSwitchBackend restarts a node on the other dataplane: the old device
// goes, the new one carries the traffic.
func TestSwitchBackend(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 2})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	a, b := n1.CNI.AddPod(t, "a"), n2.CNI.AddPod(t, "b")
	if err := Ping(a.NS, b.IP); err != nil {
		t.Fatal(err)
	}
	n1.Stop()
	n1.Args = append(n1.Args, "--backend", "uvxlan")
	n1.Start()
	n1.WaitReady()
	links := nettest.MustRun(t, n1, "ip", "-o", "link", "show")
	if strings.Contains(links, device+":") || !strings.Contains(links, "weft-u.1") {
		t.Fatalf("after switching to uvxlan the links are:\n%s", links)
	}
	Eventually(t, 5*time.Second, "ping over uvxlan", func() error { return Ping(a.NS, b.IP) })
	if _, err := Transfer(a.NS, b.NS, b.IP, 10<<20); err != nil {
		t.Fatal(err)
	}
	n1.Stop()
	n1.Args = n1.Args[:len(n1.Args)-2]
	n1.Start()
	n1.WaitReady()
	links = nettest.MustRun(t, n1, "ip", "-o", "link", "show")
	if strings.Contains(links, "weft-u.1") || !strings.Contains(links, device+":") {
		t.Fatalf("after switching back to vxlan the links are:\n%s", links)
	}
	Eventually(t, 5*time.Second, "ping over kernel vxlan again", func() error { return Ping(a.NS, b.IP) })
}

// TestDualStackUserspace runs two dual-stack uvxlan nodes (a TAP per
// family) beside a dual-stack kernel VXLAN node, with uvxlan's fast path on
// and off: both families cross both ways between each uvxlan node and the
// others, and full-size IPv6 packets with DF set too (the pods get the
// IPv6 overlay's smaller MTU).
func TestDualStackUserspace(t *testing.T) {
	for _, fastPath := range []bool{true, false} {
		t.Run(fmt.Sprintf("FastPath %v", fastPath), func(t *testing.T) {
			c := NewCluster(t, Options{Nodes: 0, UnderlayV6: netip.MustParsePrefix("fd77::/64"),
				Config: fmt.Sprintf(`{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan","FastPath":%v}}`, fastPath)})
			u := c.AddNode("user", "--backend", "uvxlan")
			u2 := c.AddNode("user2", "--backend", "uvxlan")
			k := c.AddNode("kern")
			for _, n := range []*Node{u, u2, k} {
				n.WaitReady()
			}
			links := nettest.MustRun(t, u, "ip", "-o", "link", "show")
			if !strings.Contains(links, "weft-u.1") || !strings.Contains(links, "weft-u6.1") {
				t.Fatalf("dual-stack uvxlan node needs a TAP per family:\n%s", links)
			}
			a, b, d := u.CNI.AddPod(t, "a"), k.CNI.AddPod(t, "b"), u2.CNI.AddPod(t, "d")
			a6, b6, d6 := podIPv6(t, a), podIPv6(t, b), podIPv6(t, d)
			for _, c := range []struct {
				name     string
				src, dst *plugintest.Pod
				ip       netip.Addr
			}{
				{"IPv4 userspace → kernel", a, b, b.IP}, {"IPv4 kernel → userspace", b, a, a.IP},
				{"IPv6 userspace → kernel", a, b, b6}, {"IPv6 kernel → userspace", b, a, a6},
				{"IPv4 userspace → userspace", a, d, d.IP}, {"IPv6 userspace → userspace", d, a, a6},
			} {
				Eventually(t, 10*time.Second, c.name, func() error { return Ping(c.src.NS, c.ip) })
				if _, err := Transfer(c.src.NS, c.dst.NS, c.ip, 10<<20); err != nil {
					t.Errorf("%s: %v", c.name, err)
				}
			}
			fullSizeIPv6(t, a, b, b6)
			fullSizeIPv6(t, b, a, a6)
			fullSizeIPv6(t, a, d, d6)
			fullSizeIPv6(t, d, a, a6)
		})
	}
}

func podIPv6(t *testing.T, p *plugintest.Pod) netip.Addr {
	t.Helper()
	for _, ip := range p.Result.IPs {
		if ip.Address.IP.To4() == nil {
			a, _ := netip.AddrFromSlice(ip.Address.IP)
			return a
		}
	}
	t.Fatalf("pod %s has no IPv6 address: %v", p.ID, p.Result.IPs)
	return netip.Addr{}
}

// TestFlannelDeviceToUVXLAN replaces flanneld by weftd's userspace
// dataplane on one node: the kernel VXLAN devices flanneld left (flannel.1,
// up, holding UDP 8472, and one of another VNI on the same port) are
// removed, so weftd binds the port and pods talk.
func TestFlannelDeviceToUVXLAN(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 0})
	k := c.AddNode("kern")
	c.OnNode = func(n *Node) {
		for _, d := range []struct{ name, vni string }{{"flannel.1", "1"}, {"flannel.7", "7"}} {
			nettest.MustRun(t, n, "ip", "link", "add", d.name, "type", "vxlan", "id", d.vni, "dstport", "8472",
				"local", n.Addr.String(), "dev", "eth0", "nolearning")
			nettest.MustRun(t, n, "ip", "link", "set", d.name, "up")
		}
		if out := nettest.MustRun(t, n, "ss", "-uanp"); !strings.Contains(out, ":8472") {
			t.Fatalf("flannel.1 does not hold the port:\n%s", out)
		}
	}
	u := c.AddNode("user", "--backend", "uvxlan")
	c.OnNode = nil
	k.WaitReady()
	u.WaitReady()
	if out := nettest.MustRun(t, u, "ip", "-o", "link", "show", "type", "vxlan"); strings.TrimSpace(out) != "" {
		t.Fatalf("kernel vxlan devices left on the uvxlan node:\n%s", out)
	}
	a, b := k.CNI.AddPod(t, "a"), u.CNI.AddPod(t, "b")
	Eventually(t, 5*time.Second, "ping to the uvxlan node", func() error { return Ping(a.NS, b.IP) })
	if err := Ping(b.NS, a.IP); err != nil {
		t.Fatalf("ping from the uvxlan node: %v", err)
	}
	if _, err := Transfer(a.NS, b.NS, b.IP, 10<<20); err != nil {
		t.Fatal(err)
	}
}

// TestFastPathThroughWeftd runs uvxlan with the fast path on (the default
// of a uvxlan network config) through the real weftd, with pods behind the CNI
// plugin's bridge, next to a kernel VXLAN node: pods reach each other both
// ways, transfers arrive intact, and the fast path's counters show that it
// carried them.
func TestFastPathThroughWeftd(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 0,
		Config: `{"Network": "10.244.0.0/16", "Backend": {"Type": "uvxlan"}}`})
	f1, f2 := c.AddNode("fast1"), c.AddNode("fast2")
	k := c.AddNode("kern", "--backend", "vxlan")
	for _, n := range []*Node{f1, f2, k} {
		n.WaitReady()
	}
	p1, p2, pk := f1.CNI.AddPod(t, "a"), f2.CNI.AddPod(t, "b"), k.CNI.AddPod(t, "c")
	for _, dir := range []struct {
		name     string
		src, dst *plugintest.Pod
	}{{"fast → fast", p1, p2}, {"fast ← fast", p2, p1}, {"fast → kernel", p1, pk}, {"kernel → fast", pk, p1}} {
		if err := Ping(dir.src.NS, dir.dst.IP); err != nil {
			t.Fatalf("%s: ping: %v", dir.name, err)
		}
		rate, err := Transfer(dir.src.NS, dir.dst.NS, dir.dst.IP, 50<<20)
		if err != nil {
			t.Fatalf("%s: %v", dir.name, err)
		}
		t.Logf("50 MiB %s at %.2f Gb/s", dir.name, rate*8/1e9)
	}
	if err := Ping(p1.NS, pk.IP, "-M", "do", "-s", "1422"); err != nil {
		t.Errorf("DF ping at the MTU: %v", err)
	}
	for _, n := range []*Node{f1, f2} {
		for _, ev := range []string{"fastpath_tx_frames", "fastpath_rx_frames"} {
			v, err := n.Metric("weft_dataplane_events_total", "event", ev)
			if err != nil || v < 1000 {
				t.Errorf("%s: weft_dataplane_events_total{event=%q} = %v (%v), want the transfers counted", n.Label, ev, v, err)
			}
		}
		if v, err := n.Metric("weft_dataplane_events_total", "event", "fastpath_attaches"); err != nil || v != 1 {
			t.Errorf("%s: fastpath_attaches = %v (%v), want 1", n.Label, v, err)
		}
	}
}
