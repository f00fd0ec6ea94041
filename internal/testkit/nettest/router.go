package nettest

import (
	"net/netip"
	"slices"
	"strconv"
	"testing"
)

// RoutedPods builds a node namespace that routes between two pods, the
// shape of the flow and policy tests: pod i's eth0 is paired with the
// node's v<i>; in nets[i] the node holds the first address and the pod the
// second, with a default route via the node. The nets are both IPv4 or
// both IPv6 (added without DAD, so usable at once), and the node forwards
// that family. The namespaces are labelled label+"node", +"p1", +"p2".
func RoutedPods(tb testing.TB, label string, nets [2]netip.Prefix) (node, p1, p2 *NS) {
	tb.Helper()
	node, p1, p2 = NewNS(tb, label+"node"), NewNS(tb, label+"p1"), NewNS(tb, label+"p2")
	ip, opts, forward := []string{"ip"}, []string{}, "net.ipv4.ip_forward=1"
	if nets[0].Addr().Is6() {
		ip, opts, forward = []string{"ip", "-6"}, []string{"nodad"}, "net.ipv6.conf.all.forwarding=1"
	}
	for i, pod := range []*NS{p1, p2} {
		dev := "v" + strconv.Itoa(i+1)
		Veth(tb, node, dev, pod, "eth0")
		gw := nets[i].Masked().Addr().Next()
		for _, a := range []struct {
			ns   *NS
			dev  string
			addr netip.Addr
		}{{node, dev, gw}, {pod, "eth0", gw.Next()}} {
			add := []string{"addr", "add", netip.PrefixFrom(a.addr, nets[i].Bits()).String(), "dev", a.dev}
			MustRun(tb, a.ns, slices.Concat(ip, add, opts)...)
		}
		MustRun(tb, pod, slices.Concat(ip, []string{"route", "add", "default", "via", gw.String()})...)
	}
	MustRun(tb, node, "sysctl", "-qw", forward)
	return node, p1, p2
}
