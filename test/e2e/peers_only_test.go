package e2e

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/vtep"
)

// TestOnlyPeersReachPodsThroughWeftd runs weftd on a kernel VXLAN node and
// on a uvxlan node (fast path on, the default) and puts a host with no
// lease on their underlay. Its forged VXLAN datagrams (VNI 1, to a node's
// VTEP MAC, an inner UDP datagram to that node's pod, inner source the
// other node's pod and then 203.0.113.7) reach neither pod, and each node's
// weft_dataplane_drops_total{reason="not_peer"} counts them, while a TCP
// transfer between the pods runs and arrives whole. The same datagram from
// the peer node does reach the pod.
func TestOnlyPeersReachPodsThroughWeftd(t *testing.T) {
	c := NewCluster(t, Options{Nodes: 0})
	k := c.AddNode("kern")
	u := c.AddNode("user", "--backend", "uvxlan")
	k.WaitReady()
	u.WaitReady()
	evil := c.Underlay.AddHost(t, "evil", "eth0")
	a, b := k.CNI.AddPod(t, "a"), u.CNI.AddPod(t, "b")
	if err := Ping(a.NS, b.IP); err != nil {
		t.Fatalf("kernel → userspace: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := Transfer(b.NS, a.NS, a.IP, 50<<20)
		done <- err
	}()
	for _, tc := range []struct {
		node, peer *Node
		pod        netip.Addr
		ns         *nettest.NS
		from       netip.Addr // the inner source a peer's pod would have
	}{{k, u, a.IP, a.NS, b.IP}, {u, k, b.IP, b.NS, a.IP}} {
		sink := nettest.ListenUDP(t, tc.ns, netip.AddrPortFrom(tc.pod, 9999))
		to := netip.AddrPortFrom(tc.node.Addr, 8472)
		forge := func(h *nettest.Host, inner netip.Addr, payload string, n int) {
			d := nettest.ForgedVXLAN(1, vtep.DeviceMAC(tc.node.Addr, 1), inner, tc.pod, 9999, []byte(payload))
			for range n {
				nettest.SendUDP(t, h.NS, h.Addr, to, d)
			}
		}
		base, _ := tc.node.Metric("weft_dataplane_drops_total", "reason", "not_peer")
		forge(evil, tc.from, "evil-pod", 10)
		forge(evil, netip.MustParseAddr("203.0.113.7"), "evil-out", 10)
		forge(tc.peer.Host, tc.from, "peer", 1)
		if !sink.WaitFor("peer", 5*time.Second) {
			t.Fatalf("%s: the peer's datagram did not reach the pod", tc.node.Label)
		}
		for _, p := range []string{"evil-pod", "evil-out"} {
			if n := sink.Count(p); n != 0 {
				t.Errorf("%s: %d datagrams %q from a host with no lease reached the pod", tc.node.Label, n, p)
			}
		}
		Eventually(t, 10*time.Second, tc.node.Label+": not_peer drops counted", func() error {
			v, err := tc.node.Metric("weft_dataplane_drops_total", "reason", "not_peer")
			if err != nil || v-base != 20 {
				return fmt.Errorf("weft_dataplane_drops_total{reason=not_peer} %v (before %v, %v), want 20 more", v, base, err)
			}
			return nil
		})
	}
	if err := <-done; err != nil {
		t.Errorf("TCP transfer between the pods: %v", err)
	}
}
