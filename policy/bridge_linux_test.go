package policy

import (
	"net/netip"
	"testing"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// TestSameNodeNeedsBridgeNetfilter: two pods on one bridge, the second
// isolated for ingress with nothing allowed. With br_netfilter's
// bridge-nf-call-iptables on (in the node's namespace) the bridged packets
// reach the forward hook and are dropped; with it off they bypass the
// rules, which is why CheckBridgeNetfilter refuses that setting.
func TestSameNodeNeedsBridgeNetfilter(t *testing.T) {
	node, p1, p2 := nettest.NewNS(t, "npbr"), nettest.NewNS(t, "npbr1"), nettest.NewNS(t, "npbr2")
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
	if err := Program(node.Path, Plan{IngressIsolated: []netip.Addr{ip("10.9.0.3")}}); err != nil {
		t.Fatal(err)
	}
	ping := func() error { _, err := p1.Run("ping", "-c", "1", "-W", "1", "10.9.0.3"); return err }
	check := func() error { return node.Do(CheckBridgeNetfilter) }

	nettest.MustRun(t, node, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1")
	if err := ping(); err == nil {
		t.Error("bridge-nf-call-iptables=1: the isolated pod answered its neighbour")
	}
	if err := check(); err != nil {
		t.Errorf("bridge-nf-call-iptables=1: %v", err)
	}
	nettest.MustRun(t, node, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=0")
	if err := ping(); err != nil {
		t.Errorf("bridge-nf-call-iptables=0: the bridged ping should bypass the rules: %v", err)
	}
	if err := check(); err == nil {
		t.Error("bridge-nf-call-iptables=0: CheckBridgeNetfilter said nothing")
	}
}
