package inspect

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/backend/vxlan"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// Explain follows a packet from src to dst through the live state: the
// leases say which node owns each address, and the kernel behind h (the
// source node's namespace) says how the packet is routed, which neighbour
// and FDB entry it meets, and which underlay link carries the VXLAN
// datagram. cfg (may be nil) gives the VNI and port when the device is a
// TAP; do (nil: the caller's namespace) enters h's namespace to see whether
// the fast path's programs take the packet there. Every hop is checked
// against the leases.
func Explain(h *netlink.Handle, do func(func() error) error, leases []subnet.Lease, cfg *subnet.Config, src, dst netip.Addr) (*Path, error) {
	p := &Path{Src: src, Dst: dst}
	p.locate(leases, cfg)
	if p.Outside {
		p.explainOut(h, cfg)
		return p, nil
	}
	if p.DstLease == nil {
		return p, nil
	}
	if p.SrcLease != nil && p.SrcLease.Key() == p.DstLease.Key() {
		p.add("local", "same node: the node bridge delivers it, no encapsulation")
		return p, nil
	}
	if p.DstLease.Attrs.BackendType == subnet.BackendTypeHostGW {
		r, err := routeTo(h, dst)
		if err != nil {
			return nil, err
		}
		p.explainHostGW(h, r)
		return p, nil
	}
	k, err := ReadKernel(h, "")
	if err != nil {
		return nil, err
	}
	self, ok := SelfLease(leases, k)
	if ok && p.SrcLease != nil && self.Key() != p.SrcLease.Key() {
		p.add("vantage", "read on the node of %s, not the source's node: the path below starts there", self.Subnet)
	}
	r, err := routeTo(h, dst)
	if err != nil {
		return nil, err
	}
	if r.LinkIndex != k.Device.Index {
		hop := p.add("route", "%s leaves by link %d via %s, not the overlay device %s", dst, r.LinkIndex, gwString(r), k.Device.Name)
		hop.Problem = fmt.Sprintf("no route to %s through %s: weftd has not programmed this peer", p.DstLease.Subnet, k.Device.Name)
		return p, nil
	}
	p.explainOverlay(k, r)
	if p.UnderlayDst.IsValid() {
		p.explainUnderlay(h, do, k, cfg)
	}
	if p.replyBridge != "" && ok && p.SrcLease != nil && self.Key() == p.SrcLease.Key() {
		// The way back to a pod of the node read, after the way there.
		p.add("return", "the replies to %s: %s on %s's ingress decapsulates them, and %s on %s's egress hands TCP super-packets "+
			"straight to the pod's port, without the bridge family's output and postrouting hooks (a capture on %s does not show them)",
			p.Src, FastIngressProgram, p.UnderlayDev, FastBridgeProgram, p.replyBridge, p.replyBridge)
	}
	return p, nil
}

func (p *Path) explainOverlay(k *Kernel, r netlink.Route) {
	p.OverlayDev = k.Device.Name
	p.Gateway, _ = netip.AddrFromSlice(r.Gw)
	p.Gateway = p.Gateway.Unmap()
	want := p.DstLease
	tr, _ := k.route(want.Subnet)
	hop := p.add("route", "%s via %s dev %s onlink (proto %d)", want.Subnet, gwString(r), k.Device.Name, tr.Proto)
	if p.Gateway != kernel.Gateway(want.Subnet) {
		hop.Problem = fmt.Sprintf("gateway should be %s, the destination subnet's first address", kernel.Gateway(want.Subnet))
	}
	n, ok := k.neighbour(p.Gateway)
	wantMAC := subnet.MAC{}
	if want.Attrs.BackendData != nil {
		wantMAC = want.Attrs.BackendData.VtepMAC
	}
	switch {
	case !ok:
		hop = p.add("neighbour", "no neighbour entry for %s on %s", p.Gateway, k.Device.Name)
		hop.Problem = "the kernel would ARP on the overlay, which nobody answers"
		return
	default:
		state := "PERMANENT"
		if !n.Permanent {
			state = "not permanent"
		}
		hop = p.add("neighbour", "%s lladdr %s %s: the inner frame goes to the destination node's VTEP", p.Gateway, n.MAC, state)
		p.VTEPMAC = n.MAC
		if n.MAC != wantMAC {
			hop.Problem = fmt.Sprintf("the lease says VTEP MAC %s", wantMAC)
		}
	}
	if k.Device.Kind != KindVXLAN {
		p.UnderlayDst = want.Attrs.PublicIP
		p.add("vtep table", "%s is a TAP: weftd looks up %s in its own table → %s (from the lease)", k.Device.Name, p.VTEPMAC, p.UnderlayDst)
		return
	}
	dsts := k.fdb(p.VTEPMAC)
	switch {
	case len(dsts) == 0:
		hop = p.add("fdb", "no FDB entry for %s on %s", p.VTEPMAC, k.Device.Name)
		hop.Problem = "the kernel has nowhere to send the VXLAN datagram and drops the frame"
	default:
		p.UnderlayDst = dsts[0]
		hop = p.add("fdb", "%s dst %s self permanent", p.VTEPMAC, joinAddrs(dsts))
		if !slices.Contains(dsts, want.Attrs.PublicIP) {
			hop.Problem = fmt.Sprintf("the lease says the node is at %s", want.Attrs.PublicIP)
		}
	}
}

func (p *Path) explainUnderlay(h *netlink.Handle, do func(func() error) error, k *Kernel, cfg *subnet.Config) {
	vni, port := k.Device.VNI, k.Device.Port
	if k.Device.Kind != KindVXLAN {
		vni, port = subnet.DefaultVNI, subnet.DefaultVXLANPort
		if cfg != nil {
			vni, port = cfg.Backend.VNI, cfg.Backend.Port
		}
	}
	r, err := routeTo(h, p.UnderlayDst)
	if err != nil {
		hop := p.add("underlay", "no route to %s", p.UnderlayDst)
		hop.Problem = err.Error()
		return
	}
	link, err := h.LinkByIndex(r.LinkIndex)
	if err != nil {
		hop := p.add("underlay", "route to %s uses link %d", p.UnderlayDst, r.LinkIndex)
		hop.Problem = err.Error()
		return
	}
	p.UnderlayDev, p.UnderlayMTU = link.Attrs().Name, link.Attrs().MTU
	p.UnderlaySrc, _ = netip.AddrFromSlice(r.Src)
	p.UnderlaySrc = p.UnderlaySrc.Unmap()
	if k.Device.Local.IsValid() {
		p.UnderlaySrc = k.Device.Local
	}
	how := "on-link"
	if r.Gw != nil {
		how = "via " + gwString(r)
	}
	p.add("underlay", "%s → %s dev %s (%s)", addrOrDash(p.UnderlaySrc), p.UnderlayDst, p.UnderlayDev, how)
	p.Encapsulated = true
	who := "the kernel"
	p.Encapsulator = EncapKernel
	if k.Device.Kind != KindVXLAN {
		who = p.explainFastPath(do, k, r.LinkIndex, port)
	}
	overhead := vtep.OverheadIPv4
	if p.UnderlayDst.Is6() {
		overhead = vtep.OverheadIPv6
	}
	p.add("encapsulate", "%s wraps the frame: outer IP %s → %s, UDP → port %d, VXLAN VNI %d (+%d bytes)", who, addrOrDash(p.UnderlaySrc), p.UnderlayDst, port, vni, overhead)
	p.InnerMTU = k.Device.MTU
	hop := p.add("mtu", "overlay %s MTU %d + %d = %d ≤ underlay %s MTU %d", k.Device.Name, p.InnerMTU, overhead, p.InnerMTU+overhead, p.UnderlayDev, p.UnderlayMTU)
	if p.InnerMTU+overhead > p.UnderlayMTU {
		hop.Detail = fmt.Sprintf("overlay %s MTU %d + %d = %d > underlay %s MTU %d", k.Device.Name, p.InnerMTU, overhead, p.InnerMTU+overhead, p.UnderlayDev, p.UnderlayMTU)
		hop.Problem = "full-size packets will not fit in one underlay frame"
	}
	p.add("deliver", "node %s decapsulates VNI %d and routes %s to its bridge and the pod", p.UnderlayDst, vni, p.Dst)
	p.explainAdmission(h, cfg)
}

// explainAdmission names what the destination node checks before it
// delivers (a weft kernel VXLAN node in table inet weft-vxlan, uvxlan in
// weftd): the outer source must be the public address in this node's
// lease, and the inner source inside the cluster network.
func (p *Path) explainAdmission(h *netlink.Handle, cfg *subnet.Config) {
	if p.DstLease.Attrs.BackendType != subnet.BackendTypeVXLAN {
		return
	}
	if p.SrcLease == nil && cfg != nil && !cfg.Backend.AllowForeignSources && !inNetwork(cfg, p.Src) {
		p.add("admit", "%s is outside the cluster network: with --ip-masq (the default) this node rewrites it to its overlay address; "+
			"without it, a weft kernel VXLAN node drops the frame as it leaves its overlay device (rule %q in table inet %s)",
			p.Src, vxlan.RuleForeignSrc, vxlan.FilterTable)
	}
	var adv netip.Addr
	if p.SrcLease != nil {
		adv = p.SrcLease.Attrs.PublicIP
		if p.UnderlayDst.Is6() {
			adv = p.SrcLease.Attrs.PublicIPv6
		}
	}
	hop := p.add("admit", "node %s takes VXLAN datagrams only from its peers' public addresses (kernel VXLAN: rule %q in table inet %s; uvxlan: counted as not_peer)",
		p.UnderlayDst, vxlan.RuleNotPeer, vxlan.FilterTable)
	if !adv.IsValid() || !p.UnderlaySrc.IsValid() || adv == p.UnderlaySrc || !holds(h, adv) {
		return // the same address, or NAT on the way may rewrite it
	}
	hop.Problem = fmt.Sprintf("the datagram leaves from %s but the source's lease advertises %s, which this node holds: the destination drops it", p.UnderlaySrc, adv)
}

// holds reports whether a is an address of one of h's links.
func holds(h *netlink.Handle, a netip.Addr) bool {
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return false
	}
	for _, x := range addrs {
		if y, ok := netip.AddrFromSlice(x.IP); ok && y.Unmap() == a {
			return true
		}
	}
	return false
}

// explainFastPath says whether uvxlan's fast path or weftd encapsulates,
// from the programs attached to the TAP and the underlay link, and returns
// who does.
func (p *Path) explainFastPath(do func(func() error) error, k *Kernel, underlay, port int) string {
	fp, err := ReadFastPath(do, k.Device.Index, underlay)
	switch {
	case err != nil:
		p.Encapsulator = EncapUserspace
		hop := p.add("path", "userspace (weftd), unless the fast path takes it: its programs could not be read")
		hop.Detail = err.Error()
		return "weftd"
	case fp.Egress && p.UnderlayDst.Is4():
		p.Encapsulator = EncapFastPath
		p.add("path", "fast path: tc program %s on %s's egress encapsulates in the kernel and sends through %s, "+
			"bypassing netfilter's output and postrouting hooks (host firewall rules on UDP %d do not see it); "+
			"peers whose route leaves through another device take the userspace path", FastEgressProgram, k.Device.Name, p.UnderlayDev, port)
		if !fp.Ingress {
			hop := p.add("path", "no %s on %s's ingress: the replies come in through weftd", FastIngressProgram, p.UnderlayDev)
			hop.Detail = "the fast path attaches both programs together; weftd attaches them again at its next sync"
		}
		if fp.Ingress {
			p.replyBridge = fp.Bridge // "" when no bridge carries its program
		}
		return "the fast path"
	}
	p.Encapsulator = EncapUserspace
	why := "no fast path attached"
	if fp.Egress {
		why = "the fast path carries IPv4 only"
	}
	p.add("path", "userspace: weftd reads the frame from %s and sends the datagram (%s)", k.Device.Name, why)
	return "weftd"
}

func routeTo(h *netlink.Handle, dst netip.Addr) (netlink.Route, error) {
	rs, err := h.RouteGet(dst.AsSlice())
	if err != nil {
		return netlink.Route{}, fmt.Errorf("route get %s: %w", dst, err)
	}
	if len(rs) == 0 {
		return netlink.Route{}, errors.New("route get " + dst.String() + ": no route")
	}
	return rs[0], nil
}

func gwString(r netlink.Route) string {
	if r.Gw == nil {
		return "-"
	}
	return r.Gw.String()
}

// explainOut follows a packet to an address outside the cluster network:
// the node's own routing table, and weftd's masquerade for a pod source.
func (p *Path) explainOut(h *netlink.Handle, cfg *subnet.Config) {
	r, err := routeTo(h, p.Dst)
	if err != nil {
		hop := p.add("route", "no route to %s on this node", p.Dst)
		hop.Problem = err.Error() + ": the node needs a route (usually a default route) to it"
		return
	}
	dev := fmt.Sprintf("link %d", r.LinkIndex)
	if l, err := h.LinkByIndex(r.LinkIndex); err == nil {
		dev = l.Attrs().Name
	}
	how := "on-link"
	if r.Gw != nil {
		how = "via " + gwString(r)
	}
	src, _ := netip.AddrFromSlice(r.Src)
	p.UnderlayDev = dev
	p.add("route", "%s %s dev %s (the node's routing table; no encapsulation)", p.Dst, how, dev)
	if p.SrcLease == nil {
		p.add("source", "%s is not a pod address: it leaves as it is", p.Src)
		return
	}
	p.add("masquerade", "%s is a pod address leaving the cluster network %s: weftd's rule in table ip weft-ipv4 (with --ip-masq, the default) rewrites the source to %s's address %s, and conntrack reverses it for the replies",
		p.Src, cfg.Network, dev, addrOrDash(src.Unmap()))
}
