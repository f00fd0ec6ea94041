package vxlan

import (
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

var (
	network4 = netip.MustParsePrefix("10.244.0.0/16")
	network6 = netip.MustParsePrefix("fd00:10:244::/48")
)

// filtered is nd's config with the cluster networks set.
func (nd *node) filtered() Config {
	c := nd.config()
	c.Network, c.IPv6Network = network4, network6
	return c
}

// intruderLab is two peers with a pod each, a host on the same underlay
// that holds no lease, and a UDP sink on port 9999 in the first pod.
type intruderLab struct {
	u            *nettest.Underlay
	n1, n2       *node
	b1           *Backend
	p1, p2       *nettest.NS
	ip1, ip61    netip.Addr
	ip2, ip62    netip.Addr
	evil         *nettest.Host
	evil6        netip.Addr
	sink         *nettest.Sink
	mac1, mac1v6 subnet.MAC
	to4, to6     netip.AddrPort
}

func newIntruderLab(t *testing.T, tweak ...func(*Backend)) *intruderLab {
	l := &intruderLab{u: nettest.NewUnderlay(t, ul4, 0)}
	l.n1, l.n2 = newNode(t, l.u, 1), newNode(t, l.u, 2)
	l.p1, l.ip1, l.ip61 = pod(t, l.n1, "pod1")
	l.p2, l.ip2, l.ip62 = pod(t, l.n2, "pod2")
	l.evil = l.u.AddHost(t, "evil", "eth0")
	l.evil6 = netip.MustParseAddr("fd77::99")
	addAddr(t, l.evil.NS, "eth0", netip.PrefixFrom(l.evil6, 64))
	l.b1 = newBackend(t, l.n1.filtered())
	for _, f := range tweak {
		f(l.b1)
	}
	l.b1.Set(l.n2.entries(1))
	b2 := newBackend(t, l.n2.filtered())
	b2.Set(l.n1.entries(1))
	for _, b := range []*Backend{l.b1, b2} {
		start(t, b)
		waitReady(t, b)
	}
	l.mac1, l.mac1v6 = l.b1.MAC()
	l.to4, l.to6 = netip.AddrPortFrom(l.n1.Addr, 8472), netip.AddrPortFrom(l.n1.Addr6, 8472)
	l.sink = nettest.ListenUDP(t, l.p1, netip.AddrPortFrom(netip.IPv6Unspecified(), 9999))
	return l
}

// forge sends n datagrams from host (at src) to n1's VXLAN port, each an
// inner UDP datagram from inner to pod1 carrying payload.
func (l *intruderLab) forge(t *testing.T, host *nettest.NS, src, inner netip.Addr, payload string, n int) {
	t.Helper()
	dst, to, mac := l.ip1, l.to4, l.mac1
	if inner.Is6() {
		dst, to, mac = l.ip61, l.to6, l.mac1v6
	}
	d := nettest.ForgedVXLAN(1, mac, inner, dst, 9999, []byte(payload))
	for range n {
		nettest.SendUDP(t, host, src, to, d)
	}
}

// waitDrop waits until b has counted want more drops for reason than base.
func waitDrop(t *testing.T, b *Backend, reason string, base, want uint64) {
	t.Helper()
	eventually(t, 5*time.Second, reason+" drops", func() (bool, string) {
		got := b.Stats().Drops[reason] - base
		return got == want, fmt.Sprintf("%d %s drops, want %d", got, reason, want)
	})
}

// TestOnlyPeersReachPods: a host on the underlay that holds no lease sends
// VXLAN datagrams that a kernel VXLAN device would deliver (VNI 1, to the
// node's VTEP MAC, an inner UDP datagram to a pod), with a peer's pod
// address as inner source and then an outside one, over IPv4 and IPv6.
// None reaches the pod and each is counted as not_peer, while a TCP
// transfer between the peers' pods loses nothing. The same datagrams from
// a peer do reach the pod (the forgery is deliverable), unless their inner
// source is outside the cluster network (counted as foreign_source). A peer
// that joins is reachable from its first packet; one that leaves is
// refused.
func TestOnlyPeersReachPods(t *testing.T) {
	l := newIntruderLab(t)
	const size = 64 << 20
	tr := nettest.StartTransfer(t, l.p2, l.p1, netip.AddrPortFrom(l.ip1, 5001), size)

	// The forged datagram is deliverable: from a peer, it reaches the pod.
	l.forge(t, l.n2.NS, l.n2.Addr, l.ip2, "peer-v4", 1)
	l.forge(t, l.n2.NS, l.n2.Addr6, l.ip62, "peer-v6", 1)
	for _, p := range []string{"peer-v4", "peer-v6"} {
		if !l.sink.WaitFor(p, 5*time.Second) {
			t.Fatalf("a peer's datagram %q did not reach the pod", p)
		}
	}

	base := l.b1.Stats().Drops
	outside4, outside6 := netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("2001:db8::7")
	l.forge(t, l.evil.NS, l.evil.Addr, l.ip2, "evil-pod-v4", 10)
	l.forge(t, l.evil.NS, l.evil.Addr, outside4, "evil-out-v4", 10)
	l.forge(t, l.evil.NS, l.evil6, l.ip62, "evil-pod-v6", 10)
	l.forge(t, l.evil.NS, l.evil6, outside6, "evil-out-v6", 10)
	// A peer's pod-network frame with an outside inner source is dropped
	// where it leaves the overlay device.
	l.forge(t, l.n2.NS, l.n2.Addr, outside4, "peer-out-v4", 3)
	l.forge(t, l.n2.NS, l.n2.Addr6, outside6, "peer-out-v6", 3)

	// Sent after the forgeries, a peer's datagram arrives after them too:
	// once it is in, none of the forgeries is on its way.
	l.forge(t, l.n2.NS, l.n2.Addr, l.ip2, "peer-after", 1)
	if !l.sink.WaitFor("peer-after", 5*time.Second) {
		t.Fatal("a peer's datagram did not reach the pod after the forgeries")
	}
	for _, p := range []string{"evil-pod-v4", "evil-out-v4", "evil-pod-v6", "evil-out-v6", "peer-out-v4", "peer-out-v6"} {
		if n := l.sink.Count(p); n != 0 {
			t.Errorf("%d datagrams %q reached the pod", n, p)
		}
	}
	waitDrop(t, l.b1, "not_peer", base["not_peer"], 40)
	waitDrop(t, l.b1, "foreign_source", base["foreign_source"], 6)
	if err := tr.Wait(2 * time.Minute); err != nil {
		t.Errorf("TCP transfer between the peers' pods: %v", err)
	}

	t.Run("join and leave", func(t *testing.T) { testJoinLeave(t, l) })
	t.Run("devices made again", func(t *testing.T) { testDevicesAgain(t, l) })
}

// testDevicesAgain deletes n1's overlay devices, whose ingress hooks hold
// the overlay source check: once the backend has made them again and a
// peer's datagrams reach the pod, the same peer's frames with an outside
// inner source are still dropped and counted. On this kernel (6.18) the
// chains stay and hook the new devices; the path of older kernels, which
// delete them (the backend makes the devices and writes the table again),
// is not taken here.
func testDevicesAgain(t *testing.T, l *intruderLab) {
	nettest.MustRun(t, l.n1, "ip", "link", "del", "weft.1")
	nettest.MustRun(t, l.n1, "ip", "link", "del", "weft-v6.1")
	for i, inner := range []netip.Addr{l.ip2, l.ip62} {
		p := fmt.Sprintf("peer-again-%d", i)
		eventually(t, 10*time.Second, "a peer's datagram after the devices were deleted", func() (bool, string) {
			l.forge(t, l.n2.NS, map[bool]netip.Addr{false: l.n2.Addr, true: l.n2.Addr6}[inner.Is6()], inner, p, 1)
			time.Sleep(50 * time.Millisecond)
			return l.sink.Count(p) > 0, p + " not received"
		})
	}
	l.outsideSourcesDropped(t, "again")
}

// outsideSourcesDropped sends from n2, a peer, 3 frames with an outside
// inner source over IPv4 and 3 over IPv6 (payloads named after tag), then
// one of its own pod's: that one must reach pod1, none of the others, and
// the six be counted as foreign_source.
func (l *intruderLab) outsideSourcesDropped(t *testing.T, tag string) {
	t.Helper()
	base := l.b1.Stats().Drops
	out4, out6, after := "peer-out-v4-"+tag, "peer-out-v6-"+tag, "peer-after-"+tag
	l.forge(t, l.n2.NS, l.n2.Addr, netip.MustParseAddr("203.0.113.9"), out4, 3)
	l.forge(t, l.n2.NS, l.n2.Addr6, netip.MustParseAddr("2001:db8::9"), out6, 3)
	l.forge(t, l.n2.NS, l.n2.Addr, l.ip2, after, 1)
	if !l.sink.WaitFor(after, 5*time.Second) {
		t.Fatal("a peer's datagram did not reach the pod after the forgeries")
	}
	for _, p := range []string{out4, out6} {
		if n := l.sink.Count(p); n != 0 {
			t.Errorf("%d datagrams %q with an outside source reached the pod", n, p)
		}
	}
	waitDrop(t, l.b1, "foreign_source", base["foreign_source"], 6)
}

// testJoinLeave: a third node joins n1's table; its pod's first datagram to
// pod1 arrives (its address was admitted before its route was written).
// Then it leaves n1's table and, still sending, is refused and counted.
func testJoinLeave(t *testing.T, l *intruderLab) {
	n3 := newNode(t, l.u, 3)
	p3, _, _ := pod(t, n3, "pod3")
	b3 := newBackend(t, n3.filtered())
	b3.Set(l.n1.entries(1))
	start(t, b3)
	waitReady(t, b3)
	route := func(present bool) {
		t.Helper()
		eventually(t, 10*time.Second, fmt.Sprintf("n1's route to %s present=%v", n3.Subnet, present), func() (bool, string) {
			out := nettest.MustRun(t, l.n1, "ip", "route", "show", n3.Subnet.String())
			return strings.Contains(out, "weft.1") == present, out
		})
	}
	joined := maps.Clone(l.n2.entries(1))
	maps.Copy(joined, n3.entries(1))
	l.b1.Set(joined)
	route(true)
	to := netip.AddrPortFrom(l.ip1, 9999)
	nettest.SendUDP(t, p3, netip.IPv4Unspecified(), to, []byte("first"))
	if !l.sink.WaitFor("first", 5*time.Second) {
		t.Fatal("the first datagram of a joining peer's pod did not arrive")
	}

	base := l.b1.Stats().Drops["not_peer"]
	l.b1.Set(l.n2.entries(1))
	route(false)
	// n3 still routes pod1's subnet through the tunnel: its datagrams now
	// come from a node that is no longer a peer.
	nettest.SendUDP(t, p3, netip.IPv4Unspecified(), to, []byte("after-leave"))
	waitDrop(t, l.b1, "not_peer", base, 1)
	l.forge(t, l.n2.NS, l.n2.Addr, l.ip2, "peer-after-leave", 1)
	if !l.sink.WaitFor("peer-after-leave", 5*time.Second) {
		t.Fatal("a peer's datagram did not reach the pod")
	}
	if n := l.sink.Count("after-leave"); n != 0 {
		t.Errorf("a departed peer's datagram reached the pod (%d)", n)
	}
}

// TestPeerFilterRepair deletes the filter table, and then a peer's set
// element, behind the backend's back: the full resync puts both back and
// counts them as repairs.
func TestPeerFilterRepair(t *testing.T) {
	u := nettest.NewUnderlay(t, ul4, 0)
	n1, n2 := newNode(t, u, 1), newNode(t, u, 2)
	c := n1.filtered()
	c.ResyncInterval = 200 * time.Millisecond
	b := newBackend(t, c)
	b.Set(n2.entries(1))
	start(t, b)
	waitReady(t, b)
	set := func() string {
		return nettest.MustRun(t, n1, "nft", "list", "set", "inet", FilterTable, PeerSet) +
			nettest.MustRun(t, n1, "nft", "list", "set", "inet", FilterTable, PeerSetV6)
	}
	has := func() (bool, string) {
		s := set()
		return strings.Contains(s, n2.Addr.String()) && strings.Contains(s, n2.Addr6.String()), s
	}
	eventually(t, 5*time.Second, "peer sets", has)
	if err := RemoveFilter(n1.Path); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "table back", func() (bool, string) {
		out, err := n1.Run("nft", "list", "table", "inet", FilterTable)
		if err != nil {
			return false, err.Error()
		}
		ok, _ := has()
		return ok && strings.Contains(out, RuleNotPeer), out
	})
	nettest.MustRun(t, n1, "nft", "delete", "element", "inet", FilterTable, PeerSet, "{", n2.Addr.String(), "}")
	eventually(t, 5*time.Second, "element back", has)
	// A kernel before Linux 6.16 deletes a device's ingress chain with the
	// device; the chain alone gone is repaired too (the prerouting chain
	// where the kernel refuses ingress chains).
	chain := "overlay-weft.1"
	if _, err := n1.Run("nft", "list", "chain", "inet", FilterTable, chain); err != nil {
		chain = "prerouting"
	}
	nettest.MustRun(t, n1, "nft", "delete", "chain", "inet", FilterTable, chain)
	eventually(t, 5*time.Second, "source check chain back, counted as a repair", func() (bool, string) {
		out, err := n1.Run("nft", "list", "chain", "inet", FilterTable, chain)
		if err != nil {
			return false, err.Error()
		}
		r := b.Stats().Repairs["filter"]
		return strings.Contains(out, RuleForeignSrc) && r >= 3, fmt.Sprintf("%d repairs\n%s", r, out)
	})
}

// TestNoPeerFilter: with the filter off, no table is programmed, and one
// left from before is removed.
func TestNoPeerFilter(t *testing.T) {
	u := nettest.NewUnderlay(t, ul4, 0)
	n1, n2 := newNode(t, u, 1), newNode(t, u, 2)
	b := newBackend(t, n1.filtered())
	b.Set(n2.entries(1))
	stop := start(t, b)
	waitReady(t, b)
	stop()
	nettest.MustRun(t, n1, "nft", "list", "table", "inet", FilterTable)
	c := n1.filtered()
	c.NoPeerFilter = true
	b = newBackend(t, c)
	b.Set(vtep.Table(n2.entries(1)))
	start(t, b)
	waitReady(t, b)
	if out, err := n1.Run("nft", "list", "table", "inet", FilterTable); err == nil {
		t.Errorf("table left with the filter off:\n%s", out)
	}
}

// TestFilterSpecForeignSources: the overlay source check is a chain on
// each device's ingress hook (its device named, and in the chain's name)
// with a cluster network, or without an ingress hook one prerouting rule
// per device; AllowForeignSources leaves those out, and the port filter
// stays.
func TestFilterSpecForeignSources(t *testing.T) {
	c := Config{Port: 8472, Network: network4, IPv6Network: network6, Name: "weft.1", NameV6: "weft-v6.1",
		Local: netip.MustParseAddr("192.168.77.1"), LocalIPv6: netip.MustParseAddr("fd77::1"),
		Subnet: netip.MustParsePrefix("10.244.1.0/24"), IPv6Subnet: netip.MustParsePrefix("fd00:10:244:1::/64")}
	spec := filterSpec(c, c.specs(), inetIngress)
	for _, dev := range []string{"weft.1", "weft-v6.1"} {
		ch := spec.Chain("overlay-" + dev)
		if ch == nil || len(ch.Rules) != 1 || ch.Device != dev || ch.Hook == nil || *ch.Hook != *inetIngress {
			t.Fatalf("chain overlay-%s %+v, want one rule on %s's ingress", dev, ch, dev)
		}
	}
	if len(spec.Chains) != 3 {
		t.Fatalf("chains %+v, want input and two overlay chains", spec.Chains)
	}
	spec = filterSpec(c, c.specs(), nil)
	if pre := spec.Chain("prerouting"); pre == nil || len(pre.Rules) != 2 || len(spec.Chains) != 2 {
		t.Fatalf("without an ingress hook: chains %+v, want input and prerouting with a rule per device", spec.Chains)
	}
	c.AllowForeignSources = true
	for _, hook := range []*nftables.ChainHook{inetIngress, nil} {
		spec = filterSpec(c, c.specs(), hook)
		if len(spec.Chains) != 1 || spec.Chain("input") == nil {
			t.Fatalf("with AllowForeignSources: chains %+v, want input only", spec.Chains)
		}
	}
}

// TestForeignSourcesWhereIngressRefused: where the kernel refuses chains
// on the overlay devices' ingress hook (Linux before 5.10, or without
// CONFIG_NETFILTER_INGRESS), the backend puts the overlay source check on
// the prerouting hook and gets ready: a peer's frames with an outside
// inner source are dropped and counted, its others reach the pod. The
// test has the kernel refuse with the same error (EOPNOTSUPP) another
// way: it asks for hook number 0, the netdev family's ingress, which in
// the inet family is prerouting, a hook that takes no device.
func TestForeignSourcesWhereIngressRefused(t *testing.T) {
	l := newIntruderLab(t, func(b *Backend) {
		b.ingress = nftables.ChainHookIngress
		b.filter.Spec = filterSpec(b.cfg, b.cfg.specs(), b.ingress)
	})
	out := nettest.MustRun(t, l.n1, "nft", "list", "table", "inet", FilterTable)
	if !strings.Contains(out, "hook prerouting") || !strings.Contains(out, `iifname "weft.1"`) || strings.Contains(out, "hook ingress") {
		t.Fatalf("table without the prerouting fallback:\n%s", out)
	}
	l.outsideSourcesDropped(t, "prerouting")
}

// TestPeerFilterThousands: with 6,000 peers the filter's sets hold every
// peer's address, after the first sync (the table written whole) and after
// a full sync that adds 5,000 at once (one netlink message of them would
// overflow its list's 16-bit length, and the kernel would read it cut
// short without an error).
func TestPeerFilterThousands(t *testing.T) {
	u := nettest.NewUnderlay(t, ul4, 0)
	n1 := newNode(t, u, 1)
	b := newBackend(t, n1.filtered())
	peer := func(i int) (netip.Prefix, vtep.Peer) {
		n := i + 10
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 50 + byte(n>>8), byte(n), 0}), 24),
			vtep.Peer{MAC: mac("0a:00:00:00:00:03"), Addr: netip.AddrFrom4([4]byte{100, 64, byte(n >> 8), byte(n)})}
	}
	tab := vtep.Table{}
	for i := range 6000 {
		sn, p := peer(i)
		tab[sn] = p
	}
	b.Set(maps.Clone(tab))
	if err := b.reconcile(true); err != nil {
		t.Fatal(err)
	}
	if got := filterSets(t, n1); len(got) != 6000 {
		t.Fatalf("after the first sync the filter's sets hold %d addresses, want 6000", len(got))
	}
	// Take 5,000 out by hand: the next full sync adds them back.
	for i := 0; i < 5000; i += 500 {
		var del []string
		for j := i; j < i+500; j++ {
			_, p := peer(j)
			del = append(del, p.Addr.String())
		}
		nettest.MustRun(t, n1, "nft", "delete", "element", "inet", FilterTable, PeerSet, "{", strings.Join(del, ","), "}")
	}
	if err := b.reconcile(true); err != nil {
		t.Fatal(err)
	}
	if got, want := filterSets(t, n1), peerAddrs(tab); !maps.Equal(got, want) {
		t.Fatalf("after a full sync the filter's sets hold %d addresses, want the %d peers'", len(got), len(want))
	}
}

// TestFilterFailureKeepsRoutes: while the filter cannot be written (a
// table of its name owned by another program, from the start and then
// taken over while the backend runs), routes still follow the peers, a
// new one's added and a departed one's removed, and the backend is not
// ready at first; once the table is free, the filter is programmed on the
// retry with exactly the peers of the moment.
func TestFilterFailureKeepsRoutes(t *testing.T) {
	u := nettest.NewUnderlay(t, ul4, 0)
	n1, n2, n3 := newNode(t, u, 1), newNode(t, u, 2), newNode(t, u, 3)
	release := nettest.OwnTable(t, n1.NS, "inet", FilterTable)
	b := newBackend(t, n1.filtered())
	b.Set(n2.entries(1))
	start(t, b)
	routes := func(want, gone netip.Prefix) func() (bool, string) {
		return func() (bool, string) {
			out, _ := n1.Run("ip", "-4", "route", "show", "dev", "weft.1")
			return strings.Contains(out, want.String()) && (!gone.IsValid() || !strings.Contains(out, gone.String())), out
		}
	}
	eventually(t, 10*time.Second, "route to the new peer while the filter fails", routes(n2.Subnet, netip.Prefix{}))
	b.Set(n3.entries(1))
	eventually(t, 10*time.Second, "routes follow the peers while the filter fails", routes(n3.Subnet, n2.Subnet))
	select {
	case <-b.Ready():
		t.Fatal("ready while the filter cannot be written")
	default:
	}
	release()
	waitReady(t, b)
	admits := func(want, gone *node) func() (bool, string) {
		return func() (bool, string) {
			set, _ := n1.Run("nft", "list", "set", "inet", FilterTable, PeerSet)
			return strings.Contains(set, want.Addr.String()) && !strings.Contains(set, gone.Addr.String()), set
		}
	}
	eventually(t, 10*time.Second, "the filter admits the peer of the moment", admits(n3, n2))
	release = nettest.OwnTable(t, n1.NS, "inet", FilterTable)
	b.Set(n2.entries(1))
	eventually(t, 10*time.Second, "routes follow the peers while the filter is taken over", routes(n2.Subnet, n3.Subnet))
	release()
	eventually(t, 10*time.Second, "the filter admits the peer of the moment again", admits(n2, n3))
}
