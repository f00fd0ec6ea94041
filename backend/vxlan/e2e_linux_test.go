package vxlan

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/vtep"
)

// pod wires a pod namespace to nd by hand, as a CNI plugin would: a veth
// with <subnet>.2 (and <subnet6>::2) in the pod, the gateway <subnet>.1 on
// the host end, default routes through it, forwarding on in the host.
func pod(t *testing.T, nd *node, label string) (p *nettest.NS, ip, ip6 netip.Addr) {
	t.Helper()
	p = nettest.NewNS(t, label)
	host := "veth-" + label
	nettest.Veth(t, p, "eth0", nd.NS, host)
	gw, gw6 := nd.Subnet.Addr().Next(), nd.Subnet6.Addr().Next()
	ip, ip6 = gw.Next(), gw6.Next()
	for _, a := range []struct {
		ns   *nettest.NS
		link string
		addr netip.Prefix
	}{
		{nd.NS, host, netip.PrefixFrom(gw, nd.Subnet.Bits())},
		{nd.NS, host, netip.PrefixFrom(gw6, nd.Subnet6.Bits())},
		{p, "eth0", netip.PrefixFrom(ip, nd.Subnet.Bits())},
		{p, "eth0", netip.PrefixFrom(ip6, nd.Subnet6.Bits())},
	} {
		addAddr(t, a.ns, a.link, a.addr)
	}
	nettest.MustRun(t, p, "ip", "route", "add", "default", "via", gw.String())
	nettest.MustRun(t, p, "ip", "-6", "route", "add", "default", "via", gw6.String())
	nettest.MustRun(t, nd, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	return p, ip, ip6
}

// TestPodsPing runs a backend on each of two nodes, each programmed from the
// other's table, and pings between pods across the tunnel, IPv4 and IPv6.
// With DirectRouting the same pings go over the underlay unencapsulated.
func TestPodsPing(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			u := nettest.NewUnderlay(t, ul4, 0)
			n1, n2 := newNode(t, u, 1), newNode(t, u, 2)
			p1, ip1, ip61 := pod(t, n1, "pod1")
			p2, ip2, ip62 := pod(t, n2, "pod2")
			for _, pair := range [][2]*node{{n1, n2}, {n2, n1}} {
				c := pair[0].config()
				c.DirectRouting = direct
				b := newBackend(t, c)
				b.Set(pair[1].entries(1))
				start(t, b)
				waitReady(t, b)
			}
			for _, ping := range []struct {
				from *nettest.NS
				to   netip.Addr
			}{{p1, ip2}, {p2, ip1}, {p2, ip61}, {p1, ip62}, {n1.NS, ip2}} {
				p := ping
				if _, err := p.from.Run("ping", "-c", "3", "-i", "0.2", "-W", "2", p.to.String()); err != nil {
					t.Errorf("ping %s from %s: %v\nn1 routes:\n%s", p.to, p.from.Name, err, nettest.MustRun(t, n1, "ip", "route"))
				}
			}
			for _, dev := range []string{"weft.1", "weft-v6.1"} {
				tx := nettest.MustRun(t, n1, "ip", "-s", "-o", "link", "show", dev)
				sent := vxlanTxPackets(t, tx)
				if direct && sent != 0 {
					t.Errorf("direct routing still sent %d packets through %s", sent, dev)
				}
				if !direct && sent == 0 {
					t.Errorf("nothing went through %s: %s", dev, tx)
				}
				t.Logf("direct=%v: %s sent %d packets", direct, dev, sent)
			}
		})
	}
}

// vxlanTxPackets reads the TX packet count from `ip -s -o link show`.
func vxlanTxPackets(t *testing.T, out string) int {
	t.Helper()
	i := strings.Index(out, "TX:")
	if i < 0 {
		t.Fatalf("no TX stats in %q", out)
	}
	f := strings.Fields(strings.ReplaceAll(out[i:], `\`, " "))
	// TX: bytes packets errors dropped carrier collsns <values...>
	for j, w := range f {
		if w == "collsns" && j+2 < len(f) {
			var n int
			fmt.Sscan(f[j+2], &n)
			return n
		}
	}
	t.Fatalf("cannot parse TX stats in %q", out)
	return 0
}

// TestDirectRoutingMixed: with DirectRouting, an on-link peer gets a direct
// route and nothing on the device; a peer behind a gateway stays tunnelled.
func TestDirectRoutingMixed(t *testing.T) {
	u := nettest.NewUnderlay(t, ul4, 0)
	n1 := newNode(t, u, 1)
	c := n1.config()
	c.DirectRouting = true
	b := newBackend(t, c)
	b.Set(vtep.Table{
		netip.MustParsePrefix("10.244.2.0/24"):      {MAC: mac("0a:00:00:00:00:02"), Addr: netip.MustParseAddr("192.168.77.2")},
		netip.MustParsePrefix("10.244.9.0/24"):      {MAC: mac("0a:00:00:00:00:09"), Addr: netip.MustParseAddr("10.9.9.9")},
		netip.MustParsePrefix("fd00:10:244:2::/64"): {MAC: mac("0a:00:00:00:00:02"), Addr: netip.MustParseAddr("fd77::2")},
	})
	start(t, b)
	waitReady(t, b)
	waitState(t, n1.NS, "weft.1", kernelState{
		Neigh: []string{"10.244.9.0 lladdr 0a:00:00:00:00:09 PERMANENT"},
		FDB:   []string{"0a:00:00:00:00:09 dst 10.9.9.9 self permanent"},
		Route: []string{"10.244.9.0/24 via 10.244.9.0 proto 87 onlink"},
	})
	if got, want := lines(t, n1.NS, "ip", "route", "show", "dev", "eth0", "proto", "87"), []string{"10.244.2.0/24 via 192.168.77.2"}; !slices.Equal(got, want) {
		t.Errorf("direct routes on eth0: %q, want %q", got, want)
	}
	if got, want := lines(t, n1.NS, "ip", "-6", "route", "show", "dev", "eth0", "proto", "87"), []string{"fd00:10:244:2::/64 via fd77::2 metric 1024 pref medium"}; !slices.Equal(got, want) {
		t.Errorf("direct IPv6 routes on eth0: %q, want %q", got, want)
	}
	// Direct routes are found by their protocol and removed with their peer.
	b.Set(vtep.Table{})
	eventually(t, 5*time.Second, "direct routes removed", func() (bool, string) {
		got := lines(t, n1.NS, "ip", "route", "show", "proto", "87")
		return len(got) == 0, strings.Join(got, "\n")
	})
}

// TestRestartDropsNothing pings between pods at 50 pings a second while the
// backend on one node is stopped and started again twice, as a restarting
// weftd does, and then while its device is deleted behind its back: the
// restarts must lose no ping at all; after the device repair pings flow again.
func TestRestartDropsNothing(t *testing.T) {
	u := nettest.NewUnderlay(t, ul4, 0)
	n1, n2 := newNode(t, u, 1), newNode(t, u, 2)
	p1, _, _ := pod(t, n1, "pod1")
	_, ip2, _ := pod(t, n2, "pod2")
	b2 := newBackend(t, n2.config())
	b2.Set(n1.entries(1))
	start(t, b2)
	waitReady(t, b2)
	run1 := func() func() {
		b := newBackend(t, n1.config())
		b.Set(n2.entries(1))
		stop := start(t, b)
		waitReady(t, b)
		return stop
	}
	stop := run1()

	done := make(chan string, 1)
	go func() {
		out, err := p1.Run("ping", "-q", "-c", "100", "-i", "0.02", "-W", "5", ip2.String())
		if err != nil {
			out += err.Error()
		}
		done <- out
	}()
	for range 2 {
		time.Sleep(300 * time.Millisecond)
		stop()
		stop = run1()
	}
	out := <-done
	if !strings.Contains(out, " 0% packet loss") {
		t.Errorf("pings lost across restarts:\n%s", out)
	}
	t.Logf("across two restarts: %s", strings.TrimSpace(out[strings.Index(out, "100 packets"):]))

	nettest.MustRun(t, n1, "ip", "link", "del", "weft.1")
	eventually(t, 10*time.Second, "pings after the device was deleted", func() (bool, string) {
		out, err := p1.Run("ping", "-c", "1", "-W", "1", ip2.String())
		return err == nil, out
	})
	stop()
}

// TestFlannelPeer runs weft on n1 against a node n2 set up by hand exactly
// as flanneld's vxlan backend sets itself up (flannel.1, random MAC, its
// neighbour, FDB and route commands): pods on both ping each other.
func TestFlannelPeer(t *testing.T) {
	u := nettest.NewUnderlay(t, ul4, 0)
	n1, n2 := newNode(t, u, 1), newNode(t, u, 2)
	p1, ip1, _ := pod(t, n1, "pod1")
	p2, ip2, _ := pod(t, n2, "pod2")
	const flannelMAC = "4e:fb:7d:bf:6b:2d"
	c1 := n1.config()
	c1.LocalIPv6, c1.IPv6Subnet = netip.Addr{}, netip.Prefix{}
	b := newBackend(t, c1)
	weftMAC, _ := b.MAC()
	for _, cmd := range []string{
		"ip link add flannel.1 type vxlan id 1 local 192.168.77.2 dev eth0 dstport 8472 nolearning",
		"ip link set flannel.1 address " + flannelMAC + " mtu 1450 up",
		"ip addr add 10.244.2.0/32 dev flannel.1",
		"ip neigh replace 10.244.1.0 lladdr " + weftMAC.String() + " dev flannel.1 nud permanent",
		"bridge fdb replace " + weftMAC.String() + " dev flannel.1 dst 192.168.77.1 self permanent",
		"ip route replace 10.244.1.0/24 via 10.244.1.0 dev flannel.1 onlink",
	} {
		argv := strings.Fields(cmd)
		if argv[0] == "bridge" {
			argv[0] = "/sbin/bridge"
		}
		nettest.MustRun(t, n2, argv...)
	}
	b.Set(vtep.Table{n2.Subnet: {MAC: mac(flannelMAC), Addr: n2.Addr}})
	start(t, b)
	waitReady(t, b)
	for _, p := range []struct {
		from *nettest.NS
		to   netip.Addr
	}{{p1, ip2}, {p2, ip1}} {
		if out, err := p.from.Run("ping", "-c", "3", "-i", "0.2", "-W", "2", p.to.String()); err != nil {
			t.Errorf("ping %s: %v\n%s", p.to, err, out)
		}
	}
}
