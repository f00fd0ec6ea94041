package plugin_test

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/plugintest"
	"github.com/weft-net/weft/subnet"
)

// bridgeAddrs lists the global IPv4 addresses of dev in the node.
func (e *env) bridgeAddrs(t *testing.T, dev string) string {
	t.Helper()
	return nettest.MustRun(t, e.node, "ip", "-4", "-o", "addr", "show", "dev", dev, "scope", "global")
}

// TestSharedBridgeKeepsHostAddress: "bridge":"br0" names a bridge the host
// made and addressed itself. ADD adds the gateway and removes a gateway of
// an older node subnet (inside the Network), but never the host's address
// outside the Network: the host stays on its network.
func TestSharedBridgeKeepsHostAddress(t *testing.T) {
	f := v4File(true)
	e := newEnv(t, &f)
	if err := namespace.Bridge(e.node, "br0"); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"192.168.50.1/24", "10.244.7.1/24"} {
		if err := namespace.AddAddr(e.node, "br0", netip.MustParsePrefix(a)); err != nil {
			t.Fatal(err)
		}
	}
	n := e.newNode(t, plugintest.Options{Bridge: "br0"})
	n.AddPod(t, "a")
	got := e.bridgeAddrs(t, "br0")
	if !strings.Contains(got, "192.168.50.1/24") {
		t.Errorf("the host's address 192.168.50.1/24 was removed from br0:\n%s", got)
	}
	if !strings.Contains(got, "10.244.59.1/24") {
		t.Errorf("no gateway 10.244.59.1/24 on br0:\n%s", got)
	}
	if strings.Contains(got, "10.244.7.1/24") {
		t.Errorf("the old node subnet's gateway 10.244.7.1/24 stayed on br0:\n%s", got)
	}
	// The host still reaches its own network through br0.
	if out := nettest.MustRun(t, e.node, "ip", "-4", "route", "show", "192.168.50.0/24"); !strings.Contains(out, "br0") {
		t.Errorf("route to the host's network is gone: %q", out)
	}
}

// TestOwnBridgeIsWefts: a bridge the plugin created is marked as weft's,
// and on it a foreign address of the family is replaced by the gateway, as
// on a node subnet change.
func TestOwnBridgeIsWefts(t *testing.T) {
	f := v4File(true)
	e := newEnv(t, &f)
	n := e.newNode(t, plugintest.Options{})
	n.AddPod(t, "a")
	if out := nettest.MustRun(t, e.node, "ip", "-d", "link", "show", "cni0"); !strings.Contains(out, "alias weft: pod bridge") {
		t.Fatalf("cni0 created without weft's alias:\n%s", out)
	}
	if err := namespace.AddAddr(e.node, "cni0", netip.MustParsePrefix("192.168.99.1/24")); err != nil {
		t.Fatal(err)
	}
	n.AddPod(t, "b")
	if got := e.bridgeAddrs(t, "cni0"); strings.Contains(got, "192.168.99.1") || !strings.Contains(got, "10.244.59.1/24") {
		t.Errorf("addresses of weft's own bridge:\n%s", got)
	}
}

// TestMasqueradePerNetwork: two weft networks on one host, each on its own
// bridge and subnet file, keep a masquerade chain each. Adding pods to one
// leaves the other's rule in place; deleting the last pod of one removes its
// chain only, and the other's pods still reach the outside through NAT.
func TestMasqueradePerNetwork(t *testing.T) {
	fa := v4File(false)
	e := newEnv(t, &fa)
	fb := subnet.File{Network: netip.MustParsePrefix("10.245.0.0/16"), Subnet: netip.MustParsePrefix("10.245.7.1/24"), MTU: 1450}
	fileB := filepath.Join(t.TempDir(), "subnet-b.env")
	if err := subnet.WriteFile(fileB, fb); err != nil {
		t.Fatal(err)
	}
	na := e.newNode(t, plugintest.Options{Name: "weft-a"})
	nb := plugintest.NewNode(t, e.node, e.bin, fileB, plugintest.Options{Name: "weft-b", Bridge: "cni1", DataDir: e.dataDir})
	a := na.AddPod(t, "a")
	b, err := nb.Add(nettest.NewNS(t, "b"), "pod-b")
	if err != nil {
		t.Fatal(err)
	}
	rules := nettest.MustRun(t, e.node, "nft", "list", "table", "ip", "weft-cni")
	for _, want := range []string{"chain masq-weft-a", "ip saddr 10.244.59.0/24 ip daddr != 10.244.0.0/16",
		"chain masq-weft-b", "ip saddr 10.245.7.0/24 ip daddr != 10.245.0.0/16"} {
		if !strings.Contains(rules, want) {
			t.Errorf("no %q in:\n%s", want, rules)
		}
	}
	ping(t, a.NS, extAddr)
	ping(t, b.NS, extAddr)
	if err := nb.Del(b); err != nil {
		t.Fatal(err)
	}
	rules = nettest.MustRun(t, e.node, "nft", "list", "table", "ip", "weft-cni")
	if strings.Contains(rules, "weft-b") || strings.Contains(rules, "10.245.") {
		t.Errorf("weft-b's chain stayed after its last pod was deleted:\n%s", rules)
	}
	if !strings.Contains(rules, "ip saddr 10.244.59.0/24 ip daddr != 10.244.0.0/16") {
		t.Errorf("deleting weft-b's pod removed weft-a's rule:\n%s", rules)
	}
	ping(t, a.NS, extAddr)
}
