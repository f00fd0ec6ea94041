package e2e

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
)

const device = "weft.1"

// podsPerNode puts n pods on every node of c and returns them by node.
func podsPerNode(t *testing.T, c *Cluster, n int) [][]*plugintest.Pod {
	out := make([][]*plugintest.Pod, len(c.Nodes))
	for i, node := range c.Nodes {
		for j := range n {
			out[i] = append(out[i], node.CNI.AddPod(t, fmt.Sprintf("%s-p%d", node.Label, j+1)))
		}
	}
	return out
}

func TestPodsReachEachOtherAcrossNodes(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 3})
	pods := podsPerNode(t, c, 2)
	for i, from := range pods {
		for _, src := range from {
			if !c.Nodes[i].Subnet().Contains(src.IP) {
				t.Fatalf("pod %s has %s, outside its node subnet %s", src.ID, src.IP, c.Nodes[i].Subnet())
			}
			for j, to := range pods {
				for _, dst := range to {
					if src == dst {
						continue
					}
					if err := Ping(src.NS, dst.IP); err != nil {
						t.Errorf("pod on n%d → pod on n%d (%s → %s): %v", i+1, j+1, src.IP, dst.IP, err)
					}
				}
			}
		}
	}
	t.Run("100MB TCP transfer arrives intact", func(t *testing.T) {
		rate, err := Transfer(pods[0][0].NS, pods[2][1].NS, pods[2][1].IP, 100<<20)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("100 MiB n1 → n3 at %.2f Gb/s", rate*8/1e9)
	})
	t.Run("MTU boundary", func(t *testing.T) {
		src, dst := pods[0][0], pods[1][0]
		if err := Ping(src.NS, dst.IP, "-M", "do", "-s", "1422"); err != nil {
			t.Fatalf("DF ping with 1422 bytes of payload (a 1450-byte packet) must cross: %v", err)
		}
		if err := Ping(src.NS, dst.IP, "-M", "do", "-s", "1423"); err == nil {
			t.Fatal("DF ping with 1423 bytes of payload crossed a 1450 overlay MTU")
		}
	})
}

// TestDualStack: on dual-stack kernel VXLAN nodes both families cross, and
// the pods' MTU (FLANNEL_MTU) is the IPv6 device's, so a full-size IPv6
// packet with DF set crosses both ways.
func TestDualStack(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 2, UnderlayV6: netip.MustParsePrefix("fd77::/64"),
		Config: `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}`})
	a, b := c.Nodes[0].CNI.AddPod(t, "a"), c.Nodes[1].CNI.AddPod(t, "b")
	var a6, b6 netip.Addr
	for _, ip := range a.Result.IPs {
		if ip.Address.IP.To4() == nil {
			a6, _ = netip.AddrFromSlice(ip.Address.IP)
		}
	}
	for _, ip := range b.Result.IPs {
		if ip.Address.IP.To4() == nil {
			b6, _ = netip.AddrFromSlice(ip.Address.IP)
		}
	}
	if !a6.IsValid() || !b6.IsValid() {
		t.Fatalf("pods have no IPv6 address: %v / %v", a.Result.IPs, b.Result.IPs)
	}
	if err := Ping(a.NS, b.IP); err != nil {
		t.Errorf("IPv4: %v", err)
	}
	Eventually(t, 10*time.Second, "IPv6 ping across nodes", func() error { return Ping(a.NS, b6) })
	if _, err := Transfer(a.NS, b.NS, b6, 20<<20); err != nil {
		t.Errorf("IPv6 transfer: %v", err)
	}
	for _, n := range c.Nodes {
		if got := fileMTU(t, n); got != 1430 {
			t.Errorf("%s: FLANNEL_MTU %d, want the IPv6 device's 1430 on a dual-stack node", n.Label, got)
		}
	}
	fullSizeIPv6(t, a, b, b6)
	fullSizeIPv6(t, b, a, podIPv6(t, a))
}

// fullSizeIPv6 sends a full-size IPv6 packet with DF set (ping -M do, the
// pod's MTU minus 48 bytes of IPv6 and ICMPv6 headers) from pod src to dst6
// of pod dst, which must arrive without path-MTU discovery: on a dual-stack
// node the pods' MTU must fit the IPv6 overlay device, 20 bytes smaller
// than the IPv4 one.
func fullSizeIPv6(t *testing.T, src, dst *plugintest.Pod, dst6 netip.Addr) {
	t.Helper()
	eth0, err := src.NS.Handle.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	size := eth0.Attrs().MTU - 48
	if err := Ping(src.NS, dst6, "-M", "do", "-s", strconv.Itoa(size)); err != nil {
		t.Errorf("%s → %s: IPv6 DF ping of %d bytes (pod MTU %d − 48): %v", src.ID, dst.ID, size, eth0.Attrs().MTU, err)
	}
}

func TestRestartDropsNothing(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 2})
	a, b := c.Nodes[0].CNI.AddPod(t, "a"), c.Nodes[1].CNI.AddPod(t, "b")
	if err := Ping(a.NS, b.IP); err != nil {
		t.Fatal(err)
	}
	type result struct {
		lost int
		out  string
		err  error
	}
	res := make(chan result, 1)
	go func() {
		lost, out, err := PingLoss(a.NS, b.IP, 10*time.Millisecond, 800)
		res <- result{lost, out, err}
	}()
	time.Sleep(500 * time.Millisecond)
	for _, n := range c.Nodes {
		n.Restart()
		n.WaitReady()
	}
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.lost != 0 {
		t.Fatalf("lost %d of 800 pings while weftd restarted on both nodes:\n%s", r.lost, r.out)
	}
	t.Logf("%s", findLine(r.out, "packets transmitted"))
}

func TestDriftIsRepaired(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 2})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	a, b := n1.CNI.AddPod(t, "a"), n2.CNI.AddPod(t, "b")
	peer := n2.Subnet()
	gw := peer.Addr()
	macBefore := linkMAC(t, n1)
	peerMAC := linkMAC(t, n2)
	// Ready is a node's own lease and dataplane: n1 may learn n2's lease
	// from its watch a moment later.
	Eventually(t, 5*time.Second, "a reaches b", func() error { return Ping(a.NS, b.IP, "-W", "1") })
	tests := []struct {
		name string
		cmd  []string
	}{
		{"route", []string{"ip", "route", "del", peer.String()}},
		{"neighbour", []string{"ip", "neigh", "del", gw.String(), "dev", device}},
		{"fdb entry", []string{"bridge", "fdb", "del", peerMAC, "dev", device, "dst", n2.Addr.String()}},
		{"device", []string{"ip", "link", "del", device}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := Ping(a.NS, b.IP); err != nil {
				t.Fatalf("before: %v", err)
			}
			nettest.MustRun(t, n1, tt.cmd...)
			took := Eventually(t, 5*time.Second, "traffic back after deleting the "+tt.name, func() error {
				return Ping(a.NS, b.IP, "-W", "1")
			})
			t.Logf("repaired in %s", took.Round(time.Millisecond))
			if got := linkMAC(t, n1); got != macBefore {
				t.Fatalf("device MAC changed from %s to %s", macBefore, got)
			}
		})
	}
}

// linkMAC returns the MAC of the overlay device on n.
func linkMAC(t *testing.T, n *Node) string {
	t.Helper()
	out := nettest.MustRun(t, n, "cat", "/sys/class/net/"+device+"/address")
	return strings.TrimSpace(out)
}

func TestLeaseChangesReachEveryNode(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 3})
	n1, n3 := c.Nodes[0], c.Nodes[2]
	gone := n3.Subnet()
	n3.Stop() // SIGTERM leaves the lease; remove it as an admin would
	ctx := t.Context()
	start := time.Now()
	if _, err := c.Client.Delete(ctx, Prefix+"/subnets/"+strings.ReplaceAll(gone.String(), "/", "-")); err != nil {
		t.Fatal(err)
	}
	took := Eventually(t, 2*time.Second, "route to the deleted lease removed on n1", func() error {
		if strings.Contains(nettest.MustRun(t, n1, "ip", "route", "show", "dev", device), gone.String()) {
			return fmt.Errorf("route to %s still there", gone)
		}
		return nil
	})
	t.Logf("lease deleted → peer state gone on n1 in %s (since delete: %s)", took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	n4 := c.AddNode("n4")
	n4.WaitReady()
	fresh := n4.Subnet()
	took = Eventually(t, 2*time.Second, "route to the new node on n1", func() error {
		if !strings.Contains(nettest.MustRun(t, n1, "ip", "route", "show", "dev", device), fresh.String()) {
			return fmt.Errorf("no route to %s yet", fresh)
		}
		return nil
	})
	t.Logf("new node's lease → route on n1 in %s after n4 was ready", took.Round(time.Millisecond))
}

func TestMasquerade(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 2})
	ext := c.Underlay.AddHost(t, "ext", "eth0") // a host outside the cluster network
	a, b := c.Nodes[0].CNI.AddPod(t, "a"), c.Nodes[1].CNI.AddPod(t, "b")
	seen, err := RemoteAddrSeen(a.NS, ext.NS, ext.Addr)
	if err != nil {
		t.Fatal(err)
	}
	if seen != c.Nodes[0].Addr {
		t.Errorf("outside host saw %s, want the node's address %s", seen, c.Nodes[0].Addr)
	}
	seen, err = RemoteAddrSeen(a.NS, b.NS, b.IP)
	if err != nil {
		t.Fatal(err)
	}
	if seen != a.IP {
		t.Errorf("pod on the other node saw %s, want the pod's own address %s", seen, a.IP)
	}
	seen, err = RemoteAddrSeen(c.Nodes[1].NS, b.NS, b.IP)
	if err != nil {
		t.Fatal(err)
	}
	if gw := c.Nodes[1].Subnet().Addr().Next(); seen != gw {
		t.Errorf("node → its pod arrived from %s, want the bridge address %s: node-to-pod traffic must not be masqueraded", seen, gw)
	}
}
