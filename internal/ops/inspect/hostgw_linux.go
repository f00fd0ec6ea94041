package inspect

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/subnet"
)

// WeftRoutes returns weft's unicast routes (RouteProtocol) in h's namespace:
// the host-gw routes, and DirectRouting's.
func WeftRoutes(h *netlink.Handle) ([]Route, error) {
	rs, err := retry(func() ([]netlink.Route, error) {
		return h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: kernel.RouteProtocol, Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return nil, fmt.Errorf("list weft's routes: %w", err)
	}
	var out []Route
	for _, r := range rs {
		if r.Type != unix.RTN_UNICAST {
			continue
		}
		if rt, ok := convertRoute(r); ok {
			out = append(out, rt)
		}
	}
	return out, nil
}

// OnLinkFunc reports, for h's namespace, whether an address is on-link.
func OnLinkFunc(h *netlink.Handle) func(netip.Addr) bool {
	return func(a netip.Addr) bool {
		on, err := kernel.OnLink(h, a)
		return err == nil && on
	}
}

// SelfLeaseByAddr finds the node's own lease among ls by its public
// addresses: the lease whose PublicIP or PublicIPv6 is an address of h's
// namespace. host-gw nodes have no overlay device to find it by.
func SelfLeaseByAddr(h *netlink.Handle, ls []subnet.Lease) (subnet.Lease, bool) {
	addrs, err := retry(func() ([]netlink.Addr, error) { return h.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return subnet.Lease{}, false
	}
	mine := map[netip.Addr]bool{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			mine[ip.Unmap()] = true
		}
	}
	for _, l := range ls {
		if mine[l.Attrs.PublicIP] || mine[l.Attrs.PublicIPv6] {
			return l, true
		}
	}
	return subnet.Lease{}, false
}

// explainHostGW follows a packet to a host-gw peer: the route must go via
// the peer's public address, which must be on-link.
func (p *Path) explainHostGW(h *netlink.Handle, r netlink.Route) {
	want := p.DstLease.Attrs.PublicIP
	if p.Dst.Is6() {
		want = p.DstLease.Attrs.PublicIPv6
	}
	gw, _ := netip.AddrFromSlice(r.Gw)
	gw = gw.Unmap()
	dev := fmt.Sprint(r.LinkIndex)
	if l, err := h.LinkByIndex(r.LinkIndex); err == nil {
		dev = l.Attrs().Name
	}
	hop := p.add("route", "%s via %s dev %s (host-gw: no encapsulation)", p.Dst, addrOrDash(gw), dev)
	on, err := kernel.OnLink(h, want)
	switch {
	case err != nil || !on:
		hop.Problem = fmt.Sprintf("the destination node %s is not on this node's L2 segment: host-gw cannot reach it (use vxlan or wireguard across routers)", want)
	case gw != want:
		hop.Problem = fmt.Sprintf("next hop should be the destination node's public address %s", want)
	default:
		p.UnderlayDst, p.UnderlayDev = want, dev
		p.add("underlay", "the packet goes unchanged on %s to %s, which routes it to its pod", dev, want)
	}
}
