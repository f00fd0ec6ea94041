package masq

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

var (
	network  = netip.MustParsePrefix("10.244.0.0/16")
	network6 = netip.MustParsePrefix("fd00:10:244::/56")
	// The node's own subnets: podA and podB are in them.
	subnet  = netip.MustParsePrefix("10.244.1.0/24")
	subnet6 = netip.MustParsePrefix("fd00:10:244:1::/64")
)

// lab is one node with two pods and a host outside the cluster network, all
// on an underlay switch:
//
//	podA 10.244.1.2/25  fd00:10:244:1::2/80      ┐
//	podB 10.244.1.130/25 fd00:10:244:1:8000::2/80 ┴ node 192.168.77.1 fd77::1 ── switch ── ext 192.168.77.2 fd77::2
//
// ext has no route back to the pods: only masqueraded traffic gets answers.
type lab struct {
	node, ext, podA, podB *nettest.NS
	a, a6, b, b6          netip.Addr
	nodeAddr, nodeAddr6   netip.Addr
	extAddr, extAddr6     netip.Addr
}

func newLab(t *testing.T) *lab {
	t.Helper()
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 0)
	node, ext := u.AddHost(t, "node", "eth0"), u.AddHost(t, "ext", "eth0")
	addAddr(t, node.NS, "eth0", "fd77::1/64")
	addAddr(t, ext.NS, "eth0", "fd77::2/64")
	l := &lab{
		node: node.NS, ext: ext.NS, nodeAddr: node.Addr, extAddr: ext.Addr,
		nodeAddr6: netip.MustParseAddr("fd77::1"), extAddr6: netip.MustParseAddr("fd77::2"),
	}
	l.podA, l.a, l.a6 = wirePod(t, node.NS, "podA", "10.244.1.1/25", "fd00:10:244:1::1/80")
	l.podB, l.b, l.b6 = wirePod(t, node.NS, "podB", "10.244.1.129/25", "fd00:10:244:1:8000::1/80")
	nettest.MustRun(t, node, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	return l
}

func addAddr(t *testing.T, n *nettest.NS, link, cidr string) {
	t.Helper()
	argv := []string{"ip", "addr", "add", cidr, "dev", link}
	if strings.Contains(cidr, ":") {
		argv = append(argv, "nodad")
	}
	nettest.MustRun(t, n, argv...)
}

// wirePod makes a pod whose gateway (on the node) is gw/gw6; the pod gets
// the next address.
func wirePod(t *testing.T, node *nettest.NS, label, gw, gw6 string) (*nettest.NS, netip.Addr, netip.Addr) {
	t.Helper()
	p := nettest.NewNS(t, label)
	nettest.Veth(t, p, "eth0", node, "v-"+label)
	g, g6 := netip.MustParsePrefix(gw), netip.MustParsePrefix(gw6)
	ip, ip6 := g.Addr().Next(), g6.Addr().Next()
	addAddr(t, node, "v-"+label, gw)
	addAddr(t, node, "v-"+label, gw6)
	addAddr(t, p, "eth0", netip.PrefixFrom(ip, g.Bits()).String())
	addAddr(t, p, "eth0", netip.PrefixFrom(ip6, g6.Bits()).String())
	nettest.MustRun(t, p, "ip", "route", "add", "default", "via", g.Addr().String())
	nettest.MustRun(t, p, "ip", "-6", "route", "add", "default", "via", g6.Addr().String())
	return p, ip, ip6
}

func start(t *testing.T, m *Masq) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	t.Cleanup(stop)
	select {
	case <-m.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("masq not ready within 10s")
	}
	return stop
}

func newMasq(t *testing.T, ns *nettest.NS) *Masq { return newMasqKeepPorts(t, ns, false) }

func newMasqKeepPorts(t *testing.T, ns *nettest.NS, keepPorts bool) *Masq {
	t.Helper()
	m, err := New(Config{NetNS: ns.Path, Network: network, IPv6Network: network6, Subnet: subnet, IPv6Subnet: subnet6,
		// The periodic check never comes within a test: a repair is by
		// the kernel's notification of the change.
		KeepPorts: keepPorts, CheckInterval: time.Hour},
		slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// seenSource connects from `from` to a TCP listener on to (inside `at`) and
// returns the source address the listener saw.
func seenSource(t *testing.T, from, at *nettest.NS, to netip.Addr) (netip.Addr, error) {
	t.Helper()
	ln, err := at.Listen("tcp", net.JoinHostPort(to.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer := make(chan netip.Addr, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(peer)
			return
		}
		peer <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
		c.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := from.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		return netip.Addr{}, err
	}
	c.Close()
	return <-peer, nil
}

// TestMasquerade checks who sees which source address, with the rules in
// place and after they were deleted behind weft's back.
func TestMasquerade(t *testing.T) {
	l := newLab(t)
	// Without masquerading, ext cannot answer a pod at all.
	if _, err := seenSource(t, l.podA, l.ext, l.extAddr); err == nil {
		t.Fatal("pod reached ext without masquerade: the lab is wrong")
	}
	m := newMasq(t, l.node)
	start(t, m)

	cases := []struct {
		name     string
		from, at *nettest.NS
		to, want netip.Addr
	}{
		{"pod to outside is masqueraded", l.podA, l.ext, l.extAddr, l.nodeAddr},
		{"IPv6 pod to outside is masqueraded", l.podA, l.ext, l.extAddr6, l.nodeAddr6},
		{"pod to pod keeps the pod address", l.podA, l.podB, l.b, l.a},
		{"IPv6 pod to pod keeps the pod address", l.podA, l.podB, l.b6, l.a6},
		{"node to pod is not translated", l.node, l.podA, l.a, netip.MustParseAddr("10.244.1.1")},
		{"outside to node is not translated", l.ext, l.node, l.nodeAddr, l.extAddr},
	}
	run := func(t *testing.T) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				got, err := seenSource(t, tc.from, tc.at, tc.to)
				if err != nil {
					t.Fatalf("connect: %v", err)
				}
				if got != tc.want {
					t.Errorf("listener saw %s, want %s", got, tc.want)
				}
			})
		}
	}
	t.Run("programmed", run)

	static := func(cmd string) func() []string { return func() []string { return strings.Fields(cmd) } }
	for _, br := range []struct {
		name string
		argv func() []string
	}{
		{"nft delete table ip weft-ipv4", static("nft delete table ip weft-ipv4")},
		{"nft delete table ip6 weft-ipv6", static("nft delete table ip6 weft-ipv6")},
		{"nft flush chain", static("nft flush chain ip weft-ipv4 postrouting")},
		{"nft insert rule", static("nft insert rule ip weft-ipv4 postrouting ip saddr 10.244.0.0/16 return")},
		{"nft delete chain", static("nft delete chain ip6 weft-ipv6 postrouting")},
		{"nft add chain", static("nft add chain ip weft-ipv4 forward { type filter hook forward priority 0 ; }")},
		{"masquerade replaced by return under weft's comment", func() []string {
			h := ruleHandle(t, l.node, "masquerade")
			return []string{"nft", "replace", "rule", "ip", "weft-ipv4", "postrouting", "handle", h,
				"ip", "saddr", "10.244.0.0/16", "return", "comment", `"weft: pod leaving the cluster network"`}
		}},
	} {
		t.Run("repaired after "+br.name, func(t *testing.T) {
			before := m.Repairs()
			nettest.MustRun(t, l.node, br.argv()...)
			deadline := time.Now().Add(10 * time.Second)
			for m.Repairs() == before && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if m.Repairs() == before {
				t.Fatalf("not repaired within 10s:\n%s", nettest.MustRun(t, l.node, "nft", "list", "ruleset"))
			}
			run(t)
		})
	}
}

// ruleHandle returns the handle of the rule of weft-ipv4 postrouting whose
// text contains s.
func ruleHandle(t *testing.T, n *nettest.NS, s string) string {
	t.Helper()
	out := nettest.MustRun(t, n, "nft", "-a", "list", "chain", "ip", TableIPv4, "postrouting")
	for line := range strings.SplitSeq(out, "\n") {
		if i := strings.Index(line, "# handle "); i >= 0 && strings.Contains(line, s) {
			return strings.TrimSpace(line[i+len("# handle "):])
		}
	}
	t.Fatalf("no rule with %q in:\n%s", s, out)
	return ""
}

// TestRulesText pins the tables as nft(8) shows them.
func TestRulesText(t *testing.T) {
	n := nettest.NewNS(t, "node")
	start(t, newMasq(t, n))
	want4 := `table ip weft-ipv4 {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		meta mark & 0x00004000 == 0x00004000 return comment "weft: kube-proxy masquerades it"
		ip saddr 10.244.0.0/16 ip daddr 10.244.0.0/16 return comment "weft: pod to pod, no nat"
		ip saddr 10.244.0.0/16 ip daddr 224.0.0.0/4 return comment "weft: multicast, no nat"
		ip saddr 10.244.0.0/16 masquerade fully-random comment "weft: pod leaving the cluster network"
		ip saddr != 10.244.0.0/16 ip daddr 10.244.1.0/24 return comment "weft: to this node's pods, no nat"
		ip saddr != 10.244.0.0/16 ip daddr 10.244.0.0/16 masquerade fully-random comment "weft: to other nodes' pods from outside the cluster network"
	}
}
`
	if got := nettest.MustRun(t, n, "nft", "list", "table", "ip", TableIPv4); got != want4 {
		t.Errorf("nft list table ip %s:\n%s\nwant:\n%s", TableIPv4, got, want4)
	}
	got6 := nettest.MustRun(t, n, "nft", "list", "table", "ip6", TableIPv6)
	for _, s := range []string{
		`ip6 saddr fd00:10:244::/56 ip6 daddr ff00::/8 return comment "weft: multicast, no nat"`,
		`ip6 saddr fd00:10:244::/56 masquerade fully-random comment "weft: pod leaving the cluster network"`,
		`ip6 saddr != fd00:10:244::/56 ip6 daddr fd00:10:244:1::/64 return comment "weft: to this node's pods, no nat"`,
		`meta mark & 0x00004000 == 0x00004000 return`,
	} {
		if !strings.Contains(got6, s) {
			t.Errorf("nft list table ip6 %s lacks %q:\n%s", TableIPv6, s, got6)
		}
	}
}

// TestRestartAndRemove: a second Run adopts the tables without rewriting
// them (the table handle stays), and Remove deletes them, twice without error.
func TestRestartAndRemove(t *testing.T) {
	n := nettest.NewNS(t, "node")
	handle := func() string {
		out := nettest.MustRun(t, n, "nft", "-a", "list", "tables")
		return out
	}
	stop := start(t, newMasq(t, n))
	stop()
	before := handle()
	m2 := newMasq(t, n)
	stop2 := start(t, m2)
	time.Sleep(500 * time.Millisecond) // a few checks
	stop2()
	if after := handle(); after != before || m2.Repairs() != 0 {
		t.Errorf("restart rewrote the tables: %q → %q, repairs %d", before, after, m2.Repairs())
	}
	for range 2 {
		if err := Remove(n.Path); err != nil {
			t.Fatal(err)
		}
	}
	if out := nettest.MustRun(t, n, "nft", "list", "tables"); strings.Contains(out, "weft") {
		t.Errorf("tables left after Remove: %s", out)
	}
}

// TestFromOutside: with a route to the cluster network through the node,
// a host outside it reaches this node's pods with its own address, other
// nodes' pods (podC stands for one: it is in the cluster network but not in
// this node's subnet) with the node's, and with kube-proxy's mark set the
// packet is left to kube-proxy (not translated by weft).
func TestFromOutside(t *testing.T) {
	l := newLab(t)
	podC, c, c6 := wirePod(t, l.node, "podC", "10.244.2.1/24", "fd00:10:244:2::1/64")
	nettest.MustRun(t, l.ext, "ip", "route", "add", network.String(), "via", l.nodeAddr.String())
	nettest.MustRun(t, l.ext, "ip", "-6", "route", "add", network6.String(), "via", l.nodeAddr6.String())
	start(t, newMasq(t, l.node))
	// Fresh veths may still be settling (IPv6 neighbour discovery): wait
	// until each pod answers at all before checking what it sees.
	for _, to := range []netip.Addr{l.a, l.a6, c, c6} {
		for i := 0; ; i++ {
			if _, err := l.ext.Run("ping", "-c1", "-W1", to.String()); err == nil {
				break
			} else if i == 5 {
				t.Fatalf("%s unreachable from ext: %v", to, err)
			}
		}
	}
	cases := []struct {
		name     string
		at       *nettest.NS
		to, want netip.Addr
	}{
		{"to this node's pod keeps its source", l.podA, l.a, l.extAddr},
		{"IPv6 to this node's pod keeps its source", l.podA, l.a6, l.extAddr6},
		{"to another node's pod is masqueraded", podC, c, netip.MustParseAddr("10.244.2.1")},
		{"IPv6 to another node's pod is masqueraded", podC, c6, netip.MustParseAddr("fd00:10:244:2::1")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := seenSource(t, l.ext, tc.at, tc.to)
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			if got != tc.want {
				t.Errorf("listener saw %s, want %s", got, tc.want)
			}
		})
	}
	t.Run("kube-proxy's mark is left alone", func(t *testing.T) {
		for _, cmd := range []string{
			"nft add table inet kp",
			"nft add chain inet kp m { type filter hook forward priority mangle ; }",
			"nft add rule inet kp m meta mark set meta mark or 0x4000",
		} {
			nettest.MustRun(t, l.node, strings.Fields(cmd)...)
		}
		defer nettest.MustRun(t, l.node, "nft", "delete", "table", "inet", "kp")
		for _, to := range []netip.Addr{c, c6} {
			got, err := seenSource(t, l.ext, podC, to)
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			if want := map[bool]netip.Addr{true: l.extAddr, false: l.extAddr6}[to.Is4()]; got != want {
				t.Errorf("to %s: listener saw %s, want %s (not translated)", to, got, want)
			}
		}
	})
}
