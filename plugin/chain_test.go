package plugin_test

import (
	"net/netip"
	"strings"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
	"github.com/weft-net/weft/subnet"
)

// TestChainWithPortmap drives weft followed by the reference portmap plugin
// through libcni: ADD, CHECK, traffic, hostPort, DEL (reverse order, with
// the stored result), DEL again.
func TestChainWithPortmap(t *testing.T) {
	f := v4File(true)
	e := newEnv(t, &f)
	dns := map[string]any{"nameservers": []string{"10.96.0.10"}, "search": []string{"svc.cluster.local"}}
	n := e.newNode(t, plugintest.Options{Portmap: nettest.ReferencePlugins(t), Extra: map[string]any{"dns": dns}})
	a := n.AddPod(t, "a")
	b := n.AddPod(t, "b", map[string]any{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"})

	t.Run("result", func(t *testing.T) {
		checkResult(t, a.Result, a.NS.Path)
		if d := a.Result.DNS; len(d.Nameservers) != 1 || d.Nameservers[0] != "10.96.0.10" || len(d.Search) != 1 {
			t.Errorf("dns in result: %+v", d)
		}
		if out := nettest.MustRun(t, e.node, "ip", "-d", "link", "show", a.Result.Interfaces[1].Name); !strings.Contains(out, "hairpin on") {
			t.Errorf("host veth without hairpin (the default):\n%s", out)
		}
	})
	t.Run("distinct addresses", func(t *testing.T) {
		if a.IP == b.IP || !f.Subnet.Masked().Contains(a.IP) || !f.Subnet.Masked().Contains(b.IP) {
			t.Fatalf("pod addresses %s, %s not distinct in %s", a.IP, b.IP, f.Subnet.Masked())
		}
	})
	t.Run("ping", func(t *testing.T) {
		ping(t, a.NS, b.IP)
		ping(t, b.NS, a.IP)
		ping(t, a.NS, f.Subnet.Addr())
		ping(t, e.node, a.IP)
	})
	t.Run("check", func(t *testing.T) {
		for _, p := range []*plugintest.Pod{a, b} {
			if err := n.Check(p); err != nil {
				t.Errorf("CHECK %s: %v", p.ID, err)
			}
		}
	})
	t.Run("hostPort", func(t *testing.T) {
		tcpServe(t, b.NS, "80", "hello from b")
		for _, from := range []*nettest.NS{e.node, e.ext} {
			got, err := tcpRead(from, nodeAddr.String()+":8080")
			if err != nil || got != "hello from b" {
				t.Errorf("from %s to %s:8080: %q, %v", from.Name, nodeAddr, got, err)
			}
		}
	})
	t.Run("del", func(t *testing.T) { delTwice(t, e, n, a, b) })
}

// delTwice DELs every pod twice (the second finds nothing and succeeds) and
// checks that no veth, allocation or portmap rule is left.
func delTwice(t *testing.T, e *env, n *plugintest.Node, pods ...*plugintest.Pod) {
	for _, p := range pods {
		for i := range 2 {
			if err := n.Del(p); err != nil {
				t.Fatalf("DEL %d of %s: %v", i+1, p.ID, err)
			}
		}
	}
	if ports := e.bridgePorts(t); len(ports) != 0 {
		t.Errorf("veths left on the node: %v", ports)
	}
	if left := plugintest.StoreFiles(t, e.dataDir, "weft"); len(left) != 0 {
		t.Errorf("allocations left: %v", left)
	}
	if rules := nettest.MustRun(t, e.node, "nft", "list", "ruleset"); strings.Contains(rules, "8080") {
		t.Errorf("portmap rules left after DEL:\n%s", rules)
	}
}

func checkResult(t *testing.T, r *current.Result, sandbox string) {
	t.Helper()
	if len(r.Interfaces) != 3 || r.Interfaces[0].Name != "cni0" || r.Interfaces[2].Name != "eth0" || r.Interfaces[2].Sandbox != sandbox {
		t.Fatalf("interfaces: %v", r.Interfaces)
	}
	if len(r.IPs) != 1 || *r.IPs[0].Interface != 2 || r.IPs[0].Gateway.String() != "10.244.59.1" {
		t.Fatalf("ips: %v", r.IPs)
	}
	var dsts []string
	for _, rt := range r.Routes {
		dsts = append(dsts, rt.Dst.String()+" via "+rt.GW.String())
	}
	if strings.Join(dsts, ",") != "10.244.0.0/16 via 10.244.59.1,0.0.0.0/0 via 10.244.59.1" {
		t.Fatalf("routes: %v", dsts)
	}
	if r.Interfaces[2].Mtu != 1450 {
		t.Errorf("pod MTU in result %d, want 1450", r.Interfaces[2].Mtu)
	}
}

// TestVersions runs ADD (CHECK where the version has it) and DEL with
// every supported cniVersion; results come back in the asked version.
func TestVersions(t *testing.T) {
	f := v4File(true)
	e := newEnv(t, &f)
	for _, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			n := e.newNode(t, plugintest.Options{CNIVersion: v, Name: "net" + strings.ReplaceAll(v, ".", "")})
			p, err := n.Add(nettest.NewNS(t, "pod"), "pod-"+v)
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Result.CNIVersion; got != "1.1.0" { // converted up by NewResultFromResult
				t.Fatalf("result version %q", got)
			}
			raw, err := n.CNI.GetNetworkListCachedResult(n.List, p.RT)
			if err != nil || raw.Version() != v {
				t.Fatalf("cached result version %v, %v; want %s", raw, err, v)
			}
			ping(t, p.NS, f.Subnet.Addr())
			if v != "0.3.0" && v != "0.3.1" {
				if err := n.Check(p); err != nil {
					t.Errorf("CHECK: %v", err)
				}
			}
			if err := n.Del(p); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMasquerade: with FLANNEL_IPMASQ=false the plugin masquerades pod
// traffic leaving the cluster network; the external host has no route to
// pods, so its replies arrive only if the source was rewritten.
func TestMasquerade(t *testing.T) {
	f := v4File(false)
	e := newEnv(t, &f)
	n := e.newNode(t, plugintest.Options{})
	a := n.AddPod(t, "a")
	ping(t, a.NS, extAddr)
	rules := nettest.MustRun(t, e.node, "nft", "list", "table", "ip", "weft-cni")
	if !strings.Contains(rules, "ip saddr 10.244.59.0/24 ip daddr != 10.244.0.0/16") || !strings.Contains(rules, "masquerade") {
		t.Errorf("masquerade rule:\n%s", rules)
	}
	if c := strings.Count(rules, "masquerade"); c != 1 {
		t.Errorf("%d masquerade rules, want 1:\n%s", c, rules)
	}
}

// TestNoMasqueradeWhenDaemonDoes: FLANNEL_IPMASQ=true leaves no table.
func TestNoMasqueradeWhenDaemonDoes(t *testing.T) {
	f := v4File(true)
	e := newEnv(t, &f)
	e.newNode(t, plugintest.Options{}).AddPod(t, "a")
	if out, err := e.node.Run("nft", "list", "table", "ip", "weft-cni"); err == nil {
		t.Errorf("weft-cni table exists though the daemon masquerades:\n%s", out)
	}
}

// TestDualStack: a subnet file with IPv6 lines gives each pod both families.
func TestDualStack(t *testing.T) {
	f := v4File(false)
	f.IPv6Network = netip.MustParsePrefix("fd00:10:244::/56")
	f.IPv6Subnet = netip.MustParsePrefix("fd00:10:244:50::1/64")
	e := newEnv(t, &f)
	n := e.newNode(t, plugintest.Options{})
	a, b := n.AddPod(t, "a"), n.AddPod(t, "b")
	if len(a.Result.IPs) != 2 || len(b.Result.IPs) != 2 {
		t.Fatalf("IPs %v / %v", a.Result.IPs, b.Result.IPs)
	}
	b6, _ := netip.AddrFromSlice(b.Result.IPs[1].Address.IP)
	if !f.IPv6Subnet.Masked().Contains(b6) {
		t.Fatalf("v6 address %s not in %s", b6, f.IPv6Subnet.Masked())
	}
	ping(t, a.NS, b.IP)
	ping(t, a.NS, b6)
	ping(t, a.NS, f.IPv6Subnet.Addr())
	if err := n.Check(a); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if out := nettest.MustRun(t, e.node, "nft", "list", "table", "ip6", "weft-cni"); !strings.Contains(out, "fd00:10:244:50::/64") {
		t.Errorf("ip6 masquerade rule:\n%s", out)
	}
}

// TestIPv6Only: a subnet file with only the IPv6 lines gives IPv6 pods.
func TestIPv6Only(t *testing.T) {
	f := subnet.File{
		IPv6Network: netip.MustParsePrefix("fd00:10:244::/56"),
		IPv6Subnet:  netip.MustParsePrefix("fd00:10:244:50::1/64"),
		MTU:         1450, IPMasq: true,
	}
	e := newEnv(t, &f)
	n := e.newNode(t, plugintest.Options{})
	a, b := n.AddPod(t, "a"), n.AddPod(t, "b")
	if len(a.Result.IPs) != 1 || !a.IP.Is6() || !f.IPv6Subnet.Masked().Contains(b.IP) {
		t.Fatalf("IPs %v / %v", a.Result.IPs, b.Result.IPs)
	}
	ping(t, a.NS, b.IP)
	if out := nettest.MustRun(t, a.NS, "ip", "-6", "route", "show", "default"); !strings.Contains(out, "via fd00:10:244:50::1") {
		t.Errorf("default route: %s", out)
	}
	if err := n.Check(a); err != nil {
		t.Errorf("CHECK: %v", err)
	}
}
