package plugin

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/weft-net/weft/subnet"
)

// Versions are the CNI spec versions the plugin speaks.
var Versions = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

// About is printed when the binary runs without CNI_COMMAND.
const About = "weft CNI plugin: wires pods to the node subnet that weftd (or flanneld) writes in its subnet file"

// CodeDrift is the CHECK error code for an attachment that no longer
// matches its prevResult (weft-specific; the spec leaves 100+ to plugins).
const CodeDrift uint = 100

// Funcs returns the command handlers for skel.PluginMainFuncs.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck, GC: cmdGC, Status: cmdStatus}
}

// plan is what ADD sets up for one subnet file: the ranges to allocate
// from, the gateway prefixes of the bridge and the pod's routes.
type plan struct {
	ranges   []Range
	gateways []netip.Prefix // empty when the bridge is no gateway (isGateway false)
	networks []netip.Prefix // the cluster Network of each gateway
	routes   []route
	mtu      int
	masq     []masqRule // empty when the daemon masquerades
	force    *bool      // delegate forceAddress
	promisc  bool
}

type route struct {
	dst      netip.Prefix
	gw       netip.Addr // invalid: on-link
	priority int
}

// masqRule masquerades traffic from src that leaves the cluster network.
type masqRule struct{ src, cluster netip.Prefix }

// newPlan is the bridge plugin's wiring, as Flannel configures it, for
// subnet file f: per family a range of the node subnet whose first address
// is the gateway; pod routes in the bridge plugin's order: ipam.routes (via
// the family's gateway unless they name one), the cluster network, and a
// default route when the bridge is the default gateway and ipam.routes
// gives none.
func newPlan(f subnet.File, c *Config) plan {
	p := plan{mtu: f.MTU, force: c.forceAddress(), promisc: c.promisc()}
	if c.MTU != 0 {
		p.mtu = c.MTU
	}
	masq := c.masquerade(f.IPMasq)
	// Ranges are numbered in order, as Flannel's plugin hands them to
	// host-local (IPv4, then IPv6), so both keep the round-robin position
	// of a range in the same last_reserved_ip.<n>.
	gws := map[bool]netip.Addr{}
	var clusterRoutes []route
	add := func(network, sub netip.Prefix) {
		if !network.IsValid() || !sub.IsValid() {
			return
		}
		gw := sub.Addr()
		gws[gw.Is6()] = gw
		p.ranges = append(p.ranges, Range{Subnet: sub.Masked(), Gateway: gw, ID: len(p.ranges)})
		if c.gateway() {
			p.gateways = append(p.gateways, sub)
			p.networks = append(p.networks, network.Masked())
		}
		clusterRoutes = append(clusterRoutes, route{dst: network.Masked(), gw: gw})
		if masq {
			p.masq = append(p.masq, masqRule{src: sub.Masked(), cluster: network.Masked()})
		}
	}
	add(f.Network, f.Subnet)
	add(f.IPv6Network, f.IPv6Subnet)
	hasDefault := map[bool]bool{}
	for _, r := range c.IPAM.Routes {
		dst, _ := netPrefix(r.Dst)
		rt := route{dst: dst.Masked(), gw: gws[dst.Addr().Is6()], priority: r.Priority}
		if a, ok := netip.AddrFromSlice(r.GW); ok {
			rt.gw = a.Unmap()
			hasDefault[dst.Addr().Is6()] = hasDefault[dst.Addr().Is6()] || dst.Bits() == 0
		}
		p.routes = append(p.routes, rt)
	}
	p.routes = append(p.routes, clusterRoutes...)
	if c.defaultGateway() {
		for _, r := range p.ranges {
			if v6 := r.Gateway.Is6(); !hasDefault[v6] {
				p.routes = append(p.routes, route{dst: netip.PrefixFrom(unspecified(v6), 0), gw: r.Gateway})
			}
		}
	}
	return p
}

func unspecified(v6 bool) netip.Addr {
	if v6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

// readSubnetFile maps the subnet file's failures to CNI codes: missing is
// transient (the daemon has not written it yet), malformed is a bad config.
func readSubnetFile(path string) (subnet.File, error) {
	f, err := subnet.ReadFile(path)
	switch {
	case err == nil:
		return f, nil
	case errors.Is(err, os.ErrNotExist):
		return f, types.NewError(types.ErrTryAgainLater, fmt.Sprintf("subnet file %s does not exist", path),
			"weftd (or flanneld) writes it once the node has a subnet lease; check that the daemon runs on this node")
	case errors.Is(err, subnet.ErrIncompleteFile):
		return f, types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "the file needs FLANNEL_NETWORK, FLANNEL_SUBNET, FLANNEL_MTU and FLANNEL_IPMASQ")
	default:
		return f, types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
}

// hostVethName derives the host end's name from the attachment, so that DEL
// and GC find it without stored state.
func hostVethName(a Attachment) string {
	h := attHash(a)
	return "veth" + hex.EncodeToString(h[:6])[:11]
}

func attHash(a Attachment) [32]byte { return sha256.Sum256([]byte(a.key())) }

// vethMACs returns stable, locally administered unicast MACs for both ends.
func vethMACs(a Attachment) (host, pod net.HardwareAddr) {
	h := attHash(a)
	host = net.HardwareAddr{0x0a, h[8], h[9], h[10], h[11], h[12]}
	pod = net.HardwareAddr{0x0a, h[13], h[14], h[15], h[16], h[17]}
	if host.String() == pod.String() {
		pod[5] ^= 1
	}
	return host, pod
}

// bridgeMAC is a stable MAC for the bridge derived from its gateway, so the
// bridge does not take its ports' addresses as they come and go.
func bridgeMAC(gws []netip.Prefix) net.HardwareAddr {
	h := sha256.Sum256([]byte(fmt.Sprint(gws)))
	return net.HardwareAddr{0x0a, 0x58, h[0], h[1], h[2], h[3]}
}

func buildResult(dns types.DNS, p plan, br, host, pod ifaceInfo, addrs []netip.Prefix) *current.Result {
	r := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: br.name, Mac: br.mac.String()},
			{Name: host.name, Mac: host.mac.String()},
			{Name: pod.name, Mac: pod.mac.String(), Sandbox: pod.sandbox, Mtu: p.mtu},
		},
		DNS: dns,
	}
	for i, a := range addrs {
		r.IPs = append(r.IPs, &current.IPConfig{
			Interface: current.Int(2),
			Address:   prefixNet(a),
			Gateway:   p.ranges[i].Gateway.AsSlice(),
		})
	}
	for _, rt := range p.routes {
		tr := &types.Route{Dst: prefixNet(rt.dst), Priority: rt.priority}
		if rt.gw.IsValid() {
			tr.GW = rt.gw.AsSlice()
		}
		r.Routes = append(r.Routes, tr)
	}
	return r
}

type ifaceInfo struct {
	name, sandbox string
	mac           net.HardwareAddr
}

func prefixNet(p netip.Prefix) net.IPNet {
	return net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func netPrefix(n net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}
