package vxlan

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/nettest"
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
	p.MustRun(t, "ip", "route", "add", "default", "via", gw.String())
	p.MustRun(t, "ip", "-6", "route", "add", "default", "via", gw6.String())
	nd.MustRun(t, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
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
					t.Errorf("ping %s from %s: %v\nn1 routes:\n%s", p.to, p.from.Name, err, n1.MustRun(t, "ip", "route"))
				}
			}
			for _, dev := range []string{"weft.1", "weft-v6.1"} {
				tx := n1.MustRun(t, "ip", "-s", "-o", "link", "show", dev)
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
