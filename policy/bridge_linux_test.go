package policy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// bridgePods is a node namespace with a bridge br0 and two pods on it:
// p1 (10.9.0.2, fd09::2) and p2 (10.9.0.3, fd09::3).
func bridgePods(t *testing.T) (node, p1, p2 *nettest.NS) {
	node, p1, p2 = nettest.NewNS(t, "npbr"), nettest.NewNS(t, "npbr1"), nettest.NewNS(t, "npbr2")
	nettest.Veth(t, node, "v1", p1, "eth0")
	nettest.Veth(t, node, "v2", p2, "eth0")
	for _, argv := range [][]string{
		{"ip", "link", "add", "br0", "type", "bridge"},
		{"ip", "link", "set", "br0", "up"},
		{"ip", "link", "set", "v1", "master", "br0"},
		{"ip", "link", "set", "v2", "master", "br0"},
	} {
		nettest.MustRun(t, node, argv...)
	}
	nettest.MustRun(t, p1, "ip", "addr", "add", "10.9.0.2/24", "dev", "eth0")
	nettest.MustRun(t, p2, "ip", "addr", "add", "10.9.0.3/24", "dev", "eth0")
	nettest.MustRun(t, p1, "ip", "addr", "add", "fd09::2/64", "dev", "eth0", "nodad")
	nettest.MustRun(t, p2, "ip", "addr", "add", "fd09::3/64", "dev", "eth0", "nodad")
	return node, p1, p2
}

func ping(n *nettest.NS, dst string) error {
	_, err := n.Run("ping", "-c", "1", "-W", "1", dst)
	return err
}

// linkLocalOf is the link-local address of eth0 in n, once its duplicate
// address detection is over.
func linkLocalOf(t *testing.T, n *nettest.NS) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := nettest.MustRun(t, n, "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link")
		if f := strings.Fields(out); len(f) > 3 && !strings.Contains(out, "tentative") {
			a, _, _ := strings.Cut(f[3], "/")
			return a + "%eth0"
		}
		if time.Now().After(deadline) {
			t.Fatalf("no link-local address on eth0: %q", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSameNodeNeedsBridgeNetfilter: two pods on one bridge, the second
// isolated for ingress with nothing allowed. With br_netfilter's
// bridge-nf-call-iptables on (in the node's namespace) the bridged packets
// reach the forward hook and are dropped; with it off they bypass the
// rules, which is why EnsureBridgeNetfilter turns it on, and
// bridge-nf-call-ip6tables with it.
func TestSameNodeNeedsBridgeNetfilter(t *testing.T) {
	node, p1, _ := bridgePods(t)
	if err := Program(node.Path, Plan{IngressIsolated: []netip.Addr{ip("10.9.0.3")}}); err != nil {
		t.Fatal(err)
	}
	nettest.MustRun(t, node, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=0", "net.bridge.bridge-nf-call-ip6tables=0")
	if err := ping(p1, "10.9.0.3"); err != nil {
		t.Errorf("bridge-nf-call-iptables=0: the bridged ping should bypass the rules: %v", err)
	}
	var changed []string
	if err := node.Do(func() (err error) { changed, err = EnsureBridgeNetfilter("/proc/sys"); return err }); err != nil {
		t.Fatal(err)
	}
	if len(changed) != 2 {
		t.Errorf("EnsureBridgeNetfilter changed %v, want both settings", changed)
	}
	for _, k := range []string{"net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables"} {
		if v := strings.TrimSpace(nettest.MustRun(t, node, "sysctl", "-n", k)); v != "1" {
			t.Errorf("%s = %s after EnsureBridgeNetfilter", k, v)
		}
	}
	if err := ping(p1, "10.9.0.3"); err == nil {
		t.Error("bridge-nf-call-iptables=1: the isolated pod answered its neighbour")
	}
	if err := node.Do(func() (err error) { changed, err = EnsureBridgeNetfilter("/proc/sys"); return err }); err != nil || len(changed) != 0 {
		t.Errorf("second EnsureBridgeNetfilter: changed %v, %v", changed, err)
	}
	// A kernel without br_netfilter: no net/bridge directory.
	if _, err := EnsureBridgeNetfilter(t.TempDir()); !errors.Is(err, ErrNoBridgeNetfilter) {
		t.Errorf("without br_netfilter: %v, want ErrNoBridgeNetfilter", err)
	}
}

// TestIPv6LinkLocalDropped is the review's bypass: in an IPv4-only
// cluster, a pod reached an isolated pod of the same node over their IPv6
// link-local addresses, which the ip-family table never saw. While a pod
// is isolated, the inet table drops link-local IPv6 that the pod bridge
// forwards (after letting neighbour discovery through), with or without
// the bridge table, so the ping that worked before the table fails after
// it, while the IPv4 of an unisolated pod still works. With no pod
// isolated the table has no forward chain, and the link-local ping works
// as it does without policy. The drop once hit every bridge of the host:
// two hosts on a second bridge of the node still ping each other's
// link-local addresses.
func TestIPv6LinkLocalDropped(t *testing.T) {
	node, p1, p2 := bridgePods(t)
	if _, err := os.Stat("/proc/sys/net/bridge"); err != nil {
		nettest.CannotRun(t, "kernel", "br_netfilter is not loaded")
	}
	nettest.MustRun(t, node, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1", "net.bridge.bridge-nf-call-ip6tables=1")
	h1, h2 := nettest.NewNS(t, "npbrh1"), nettest.NewNS(t, "npbrh2")
	nettest.Veth(t, node, "w1", h1, "eth0")
	nettest.Veth(t, node, "w2", h2, "eth0")
	for _, argv := range [][]string{
		{"ip", "link", "add", "br1", "type", "bridge"},
		{"ip", "link", "set", "br1", "up"},
		{"ip", "link", "set", "w1", "master", "br1"},
		{"ip", "link", "set", "w2", "master", "br1"},
	} {
		nettest.MustRun(t, node, argv...)
	}
	ll, other := linkLocalOf(t, p2), linkLocalOf(t, h2)
	if err := ping(p1, ll); err != nil {
		t.Fatalf("link-local ping before any policy: %v", err)
	}
	ports := []PodPort{{ip("10.9.0.2"), "v1"}, {ip("10.9.0.3"), "v2"}}
	isolated := []netip.Addr{ip("10.9.0.3")}
	for _, c := range []struct {
		name string
		plan Plan
	}{
		{"a pod isolated", Plan{IngressIsolated: isolated, Bridge: "br0"}},
		{"a pod isolated, with the bridge table", Plan{IngressIsolated: isolated, Bridge: "br0", Ports: ports}},
		{"no pod isolated", Plan{Bridge: "br0", Ports: ports}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := Remove(node.Path); err != nil {
				t.Fatal(err)
			}
			if err := Program(node.Path, c.plan); err != nil {
				t.Fatal(err)
			}
			isolated := len(c.plan.IngressIsolated) > 0
			if err := ping(p1, ll); (err == nil) == isolated {
				t.Errorf("ping to the link-local address %s (a pod isolated %v): %v", ll, isolated, err)
			}
			if err := ping(p1, "10.9.0.3"); (err == nil) == isolated {
				t.Errorf("IPv4 ping to 10.9.0.3 (isolated %v): %v", isolated, err)
			}
			if err := ping(p2, "10.9.0.2"); err != nil {
				t.Errorf("pod → an unisolated pod: %v", err)
			}
			if err := ping(h1, other); err != nil {
				t.Errorf("link-local ping on another bridge of the node: %v", err)
			}
			inet := nettest.MustRun(t, node, "nft", "list", "table", "inet", Table)
			if got := strings.Contains(inet, "hook forward"); got != isolated {
				t.Errorf("inet table with a forward chain %v, want %v:\n%s", got, isolated, inet)
			}
		})
	}
	if err := Program(node.Path, Plan{Bridge: "br0"}, Plan{Bridge: "br1", V6: true}); err == nil {
		t.Error("plans naming two bridges: no error")
	}
}

// TestIPv6Policed: on a dual-stack node the IPv6 plan isolates a pod's
// IPv6 address as the IPv4 plan does its IPv4 one, and its rules allow.
func TestIPv6Policed(t *testing.T) {
	node, p1, _ := bridgePods(t)
	if _, err := os.Stat("/proc/sys/net/bridge"); err != nil {
		nettest.CannotRun(t, "kernel", "br_netfilter is not loaded")
	}
	nettest.MustRun(t, node, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1", "net.bridge.bridge-nf-call-ip6tables=1")
	if err := ping(p1, "fd09::3"); err != nil {
		t.Fatalf("IPv6 ping before any policy: %v", err)
	}
	v4 := Plan{IngressIsolated: []netip.Addr{ip("10.9.0.3")}}
	v6 := Plan{V6: true, IngressIsolated: []netip.Addr{ip("fd09::3")}}
	if err := Program(node.Path, v4, v6); err != nil {
		t.Fatal(err)
	}
	if err := ping(p1, "fd09::3"); err == nil {
		t.Error("the isolated pod answered an IPv6 ping")
	}
	v6.Rules = []Rule{{Name: "t/allow ingress 0", Local: []netip.Addr{ip("fd09::3")}, AllPorts: true, Peers: []Range{{ip("fd09::2"), ip("fd09::2")}}}}
	if err := Program(node.Path, v4, v6); err != nil {
		t.Fatal(err)
	}
	if err := ping(p1, "fd09::3"); err != nil {
		t.Errorf("IPv6 ping allowed by the rule: %v", err)
	}
	if err := ping(p1, "10.9.0.3"); err == nil {
		t.Error("the IPv6 rule let IPv4 through")
	}
	if err := Program(node.Path, v4, v6, v4); err == nil {
		t.Error("three plans: no error")
	}
}

// TestSourceSpoofingDropped: p2 is isolated for ingress and allows only
// 10.9.0.4 (fd09::4), an address of another pod's port (v3). p1 takes
// that address as its own and pings p2 from it: without the bridge
// table's source checks the forged packets pass the policy (the test
// shows it first); with them every frame p1 sends from an address that is
// not its port's is dropped, while p2, whose packets carry its own
// address, still reaches p1.
func TestSourceSpoofingDropped(t *testing.T) {
	node, p1, p2 := bridgePods(t)
	if _, err := os.Stat("/proc/sys/net/bridge"); err != nil {
		nettest.CannotRun(t, "kernel", "br_netfilter is not loaded")
	}
	nettest.MustRun(t, node, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1", "net.bridge.bridge-nf-call-ip6tables=1")
	nettest.MustRun(t, p1, "ip", "addr", "add", "10.9.0.4/32", "dev", "eth0")
	nettest.MustRun(t, p1, "ip", "addr", "add", "fd09::4/128", "dev", "eth0", "nodad")
	allow := func(v6 bool, local, peer string) Plan {
		return Plan{V6: v6, IngressIsolated: []netip.Addr{ip(local)},
			Rules: []Rule{{Name: "t/allow ingress 0", Local: []netip.Addr{ip(local)}, AllPorts: true, Peers: []Range{{ip(peer), ip(peer)}}}}}
	}
	v4, v6 := allow(false, "10.9.0.3", "10.9.0.4"), allow(true, "fd09::3", "fd09::4")
	if err := Program(node.Path, v4, v6); err != nil {
		t.Fatal(err)
	}
	forged := func() (err4, err6 error) {
		_, err4 = p1.Run("ping", "-c", "1", "-W", "1", "-I", "10.9.0.4", "10.9.0.3")
		_, err6 = p1.Run("ping", "-c", "1", "-W", "1", "-I", "fd09::4", "fd09::3")
		return err4, err6
	}
	if err4, err6 := forged(); err4 != nil || err6 != nil {
		t.Fatalf("without source checks the forged pings should pass the policy (the hole): %v, %v", err4, err6)
	}
	v4.Ports = []PodPort{{ip("10.9.0.2"), "v1"}, {ip("10.9.0.3"), "v2"}, {ip("10.9.0.4"), "v3"}}
	v6.Ports = []PodPort{{ip("fd09::2"), "v1"}, {ip("fd09::3"), "v2"}, {ip("fd09::4"), "v3"}}
	if err := Program(node.Path, v4, v6); err != nil {
		t.Fatal(err)
	}
	if err4, err6 := forged(); err4 == nil || err6 == nil {
		t.Errorf("forged source addresses passed: IPv4 %v, IPv6 %v (nil: passed)", err4, err6)
	}
	for _, dst := range []string{"10.9.0.2", "fd09::2"} {
		if err := ping(p2, dst); err != nil {
			t.Errorf("p2 → p1 %s with the source checks on: %v", dst, err)
		}
	}
	if out := nettest.MustRun(t, node, "nft", "list", "table", "bridge", Table); !strings.Contains(out, `"v1" . 10.9.0.2`) {
		t.Errorf("bridge table without p1's port and address:\n%s", out)
	}
}

// TestPortsFromStore: the bridge port of each reserved address, named as
// the CNI plugin names its host veths (the plugin's golden names).
func TestPortsFromStore(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"10.244.1.2": "c1\r\neth0", "fd00::5": "c2\r\neth0", "lock": "", "last_reserved_ip.0": "10.244.1.2",
	} {
		if err := os.WriteFile(dir+"/"+name, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := PortsFromStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []PodPort{{ip("10.244.1.2"), "vethd2528480aff"}, {ip("fd00::5"), "veth50d33405d10"}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("got %v, want %v", got, want)
	}
	if _, err := PortsFromStore(dir + "/missing"); err == nil {
		t.Error("a missing store: no error")
	}
}

// TestBroadcastToIsolatedPodDropped is the review's hole: the inet
// table's ingress check matches packets by destination address, so a
// broadcast (10.9.0.255), an IPv4 multicast (224.0.0.1) or an IPv6
// multicast from a global source (ff02::1 from fd09::2) reached a pod
// isolated for ingress. With the bridge table's forward chain they are
// dropped on the isolated pod's port, while the unisolated pod still
// receives the same datagrams from its neighbour, and ARP and neighbour
// discovery keep working (the isolated pod still reaches out).
func TestBroadcastToIsolatedPodDropped(t *testing.T) {
	node, p1, p2 := bridgePods(t)
	if _, err := os.Stat("/proc/sys/net/bridge"); err != nil {
		nettest.CannotRun(t, "kernel", "br_netfilter is not loaded")
	}
	nettest.MustRun(t, node, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1", "net.bridge.bridge-nf-call-ip6tables=1")
	for _, p := range []*nettest.NS{p1, p2} {
		nettest.MustRun(t, p, "ip", "route", "add", "224.0.0.0/4", "dev", "eth0")
		nettest.MustRun(t, p, "ip", "route", "add", "255.255.255.255/32", "dev", "eth0")
	}
	v4 := Plan{IngressIsolated: []netip.Addr{ip("10.9.0.3")}, Ports: []PodPort{{ip("10.9.0.2"), "v1"}, {ip("10.9.0.3"), "v2"}}}
	v6 := Plan{V6: true, IngressIsolated: []netip.Addr{ip("fd09::3")}, Ports: []PodPort{{ip("fd09::2"), "v1"}, {ip("fd09::3"), "v2"}}}
	if err := Program(node.Path, v4, v6); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, network, src, dst string
	}{
		{"broadcast", "udp4", "", "10.9.0.255:9999"},
		{"limited broadcast", "udp4", "", "255.255.255.255:9999"},
		{"IPv4 multicast", "udp4", "", "224.0.0.1:9999"},
		{"IPv6 multicast from a global source", "udp6", "[fd09::%s]:0", "[ff02::1%eth0]:9999"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// p2 (isolated) must not receive from p1; p1 (not isolated) does
			// receive the same from p2.
			if got := datagram(t, p1, "2", p2, c.network, c.src, c.dst); got {
				t.Errorf("the isolated pod received a %s", c.name)
			}
			if got := datagram(t, p2, "3", p1, c.network, c.src, c.dst); !got {
				t.Errorf("the unisolated pod did not receive a %s (the test's own check)", c.name)
			}
		})
	}
	if err := ping(p2, "10.9.0.2"); err != nil {
		t.Errorf("the isolated pod cannot reach its neighbour over IPv4 (ARP): %v", err)
	}
	if err := ping(p2, "fd09::2"); err != nil {
		t.Errorf("the isolated pod cannot reach its neighbour over IPv6 (neighbour discovery): %v", err)
	}
	// Allowed ingress needs the neighbour solicitation, multicast, to reach
	// the isolated pod.
	allow := func(p Plan, peer, local string) Plan {
		p.Rules = []Rule{{Name: "t/allow ingress 0", Local: []netip.Addr{ip(local)}, AllPorts: true, Peers: []Range{{ip(peer), ip(peer)}}}}
		return p
	}
	if err := Program(node.Path, allow(v4, "10.9.0.2", "10.9.0.3"), allow(v6, "fd09::2", "fd09::3")); err != nil {
		t.Fatal(err)
	}
	nettest.MustRun(t, p1, "ip", "neigh", "flush", "dev", "eth0")
	for _, dst := range []string{"10.9.0.3", "fd09::3"} {
		if err := ping(p1, dst); err != nil {
			t.Errorf("allowed ping to the isolated pod's %s (ARP, neighbour solicitation): %v", dst, err)
		}
	}
}

// datagram sends UDP datagrams from `from` (src: a format of the local
// address taking the sender's last digit, "" for any) to dst, and says
// whether a socket bound to the wildcard address on port 9999 in `to`
// received one.
func datagram(t *testing.T, from *nettest.NS, last string, to *nettest.NS, network, src, dst string) bool {
	t.Helper()
	var rc net.PacketConn
	if err := to.Do(func() (err error) { rc, err = net.ListenPacket(network, ":9999"); return err }); err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var sc net.Conn
	if err := from.Do(func() error {
		d := net.Dialer{}
		if src != "" {
			la, err := net.ResolveUDPAddr(network, fmt.Sprintf(src, last))
			if err != nil {
				return err
			}
			d.LocalAddr = la
		}
		var err error
		sc, err = d.Dial(network, dst)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	got := make(chan bool, 1)
	go func() {
		buf := make([]byte, 64)
		rc.SetReadDeadline(time.Now().Add(time.Second))
		_, _, err := rc.ReadFrom(buf)
		got <- err == nil
	}()
	for i := 0; i < 5; i++ {
		if _, err := sc.Write([]byte("hello")); err != nil {
			t.Fatalf("send to %s: %v", dst, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return <-got
}

// TestBridgeTableRefusedKeepsEnforcing is the review's fail-open case: on
// a kernel without nftables' bridge family the bridge table, in the same
// transaction as the inet table, made every transaction fail, so nothing
// was enforced. The test has the kernel refuse the bridge table by
// holding one of that name owned by another socket (flags owner):
// Program then commits the inet table alone (the isolated pod is
// unreachable) and says so with ErrNoSourceChecks.
func TestBridgeTableRefusedKeepsEnforcing(t *testing.T) {
	node, p1, _ := bridgePods(t)
	if _, err := os.Stat("/proc/sys/net/bridge"); err != nil {
		nettest.CannotRun(t, "kernel", "br_netfilter is not loaded")
	}
	nettest.MustRun(t, node, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1", "net.bridge.bridge-nf-call-ip6tables=1")
	// nft -i keeps its socket, and so its table, until its input ends.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nft := node.Command(ctx, "nft", "-i")
	in, err := nft.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := nft.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); nft.Wait() }()
	if _, err := fmt.Fprintf(in, "add table bridge %s { flags owner; }\n", Table); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(nettest.MustRun(t, node, "nft", "list", "tables"), "bridge "+Table) {
		if time.Now().After(deadline) {
			t.Fatal("nft -i made no owned bridge table")
		}
		time.Sleep(50 * time.Millisecond)
	}
	plan := Plan{IngressIsolated: []netip.Addr{ip("10.9.0.3")}, Ports: []PodPort{{ip("10.9.0.2"), "v1"}, {ip("10.9.0.3"), "v2"}}}
	err = Program(node.Path, plan)
	if !errors.Is(err, ErrNoSourceChecks) {
		t.Errorf("Program with the bridge table refused: %v, want ErrNoSourceChecks", err)
	}
	if err := ping(p1, "10.9.0.3"); err == nil {
		t.Error("the isolated pod answered: the inet table was not committed")
	}
	if err := Program(node.Path, Plan{}); err != nil { // no ports: no bridge table, no error
		t.Errorf("Program without ports: %v", err)
	}
}
