package uvxlan

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/vtep"
)

// TestOnlyPeersReachPods is backend/vxlan's test of the same name on
// uvxlan, with the fast path off and on: a host on the underlay that holds
// no lease sends VXLAN datagrams a VTEP would deliver (VNI 1, to the
// node's VTEP MAC, an inner UDP datagram to its pod), with a peer's pod
// address as inner source and then an outside one. None reaches the pod
// and each is counted as not_peer, while a TCP transfer between the peers'
// pods loses nothing (with the fast path on it runs there: the ingress
// program leaves the forgeries to the userspace path, which drops them).
// A peer that joins is reachable from its first packet; one that leaves is
// refused.
func TestOnlyPeersReachPods(t *testing.T) {
	for _, fast := range []bool{false, true} {
		t.Run(fmt.Sprintf("fastpath=%v", fast), func(t *testing.T) { testOnlyPeers(t, fast) })
	}
}

func testOnlyPeers(t *testing.T, fast bool) {
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	mod := func(c *Config) { c.FastPath = fast }
	a := newUVNodeWith(t, u, "a", subnetA, mod)
	b := newUVNodeWith(t, u, "b", subnetB, mod)
	evil := u.AddHost(t, "evil", "eth0")
	connect(t, a, b)
	sink := nettest.ListenUDP(t, a.pod, netip.AddrPortFrom(a.podIP, 9999))
	to := netip.AddrPortFrom(a.host.Addr, 8472)
	forge := func(from *nettest.Host, inner netip.Addr, payload string, n int) {
		d := nettest.ForgedVXLAN(1, a.mac, inner, a.podIP, 9999, []byte(payload))
		for range n {
			nettest.SendUDP(t, from.NS, from.Addr, to, d)
		}
	}
	tr := nettest.StartTransfer(t, b.pod, a.pod, netip.AddrPortFrom(a.podIP, 5001), 64<<20)

	forge(b.host, b.podIP, "peer", 1)
	if !sink.WaitFor("peer", 5*time.Second) {
		t.Fatal("a peer's datagram did not reach the pod")
	}
	base := a.b.Stats().Drops[DropNotPeer.String()]
	forge(evil, b.podIP, "evil-pod", 10)
	forge(evil, netip.MustParseAddr("203.0.113.7"), "evil-out", 10)
	forge(b.host, b.podIP, "peer-after", 1)
	if !sink.WaitFor("peer-after", 5*time.Second) {
		t.Fatal("a peer's datagram did not reach the pod after the forgeries")
	}
	for _, p := range []string{"evil-pod", "evil-out"} {
		if n := sink.Count(p); n != 0 {
			t.Errorf("%d datagrams %q reached the pod", n, p)
		}
	}
	waitDrops(t, a.b, DropNotPeer, base+20)
	if err := tr.Wait(2 * time.Minute); err != nil {
		t.Errorf("TCP transfer between the peers' pods: %v", err)
	}
	if fast && a.b.Stats().Events[EventFastRxFrames] == 0 {
		t.Error("the fast path took none of the transfer")
	}

	// A third node joins a's table, then leaves it.
	c := newUVNodeWith(t, u, "c", netip.MustParsePrefix("10.244.3.0/24"), mod)
	c.b.Set(vtep.Table{a.subnet: {MAC: a.mac, Addr: a.host.Addr}})
	route := func(present bool) {
		t.Helper()
		eventually(t, fmt.Sprintf("a's route to %s present=%v", c.subnet, present), func() error {
			out := nettest.MustRun(t, a.host, "ip", "route", "show", c.subnet.String())
			if strings.Contains(out, "via") != present {
				return fmt.Errorf("route: %q", out)
			}
			return nil
		})
	}
	peers := vtep.Table{b.subnet: {MAC: b.mac, Addr: b.host.Addr}}
	joined := vtep.Table{b.subnet: peers[b.subnet], c.subnet: {MAC: c.mac, Addr: c.host.Addr}}
	a.b.Set(joined)
	route(true)
	// c sends once its own dataplane has programmed a (what is tested is
	// that a takes c's first packet, not how soon c can send one).
	select {
	case <-c.b.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("c's dataplane never became ready")
	}
	eventually(t, fmt.Sprintf("c's route to %s", a.subnet), func() error {
		if out := nettest.MustRun(t, c.host, "ip", "route", "show", a.subnet.String()); !strings.Contains(out, "via") {
			return fmt.Errorf("route: %q", out)
		}
		return nil
	})
	dst := netip.AddrPortFrom(a.podIP, 9999)
	nettest.SendUDP(t, c.pod, netip.IPv4Unspecified(), dst, []byte("first"))
	if !sink.WaitFor("first", 5*time.Second) {
		t.Fatal("the first datagram of a joining peer's pod did not arrive")
	}
	base = a.b.Stats().Drops[DropNotPeer.String()]
	a.b.Set(peers)
	route(false)
	nettest.SendUDP(t, c.pod, netip.IPv4Unspecified(), dst, []byte("after-leave"))
	waitDrops(t, a.b, DropNotPeer, base+1)
	if n := sink.Count("after-leave"); n != 0 {
		t.Errorf("a departed peer's datagram reached the pod (%d)", n)
	}
}
