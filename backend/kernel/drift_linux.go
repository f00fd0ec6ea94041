package kernel

import (
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// OverlayDrift decides which notifications are drift of overlay links
// programmed (by Overlay) with a table: anything about the links
// themselves, the loss of one of their addresses, a deleted neighbour or
// route that the table wants, or a new one that differs from it. The
// dataplane's own writes match the table it just programmed, so they do not
// trigger a sync of thousands of peers.
type OverlayDrift struct {
	Index map[int]bool    // the overlay links, by index
	Name  map[string]bool // and by name (a recreated link has a new index)
	// Routes is the programmed table itself (tables are never modified once
	// handed over): rules are made after every change, and copying a table
	// of thousands of peers each time cost more than the change.
	Routes vtep.Table
	lens   []netip.Prefix // one prefix of each length (and family) in Routes
}

// NewOverlayDrift returns the drift rules for links (name → index, 0 when
// not known yet) programmed with t.
func NewOverlayDrift(t vtep.Table, links map[string]int) OverlayDrift {
	d := OverlayDrift{Index: map[int]bool{}, Name: map[string]bool{}, Routes: t}
	for p := range t {
		if !slices.ContainsFunc(d.lens, func(l netip.Prefix) bool { return l.Bits() == p.Bits() && l.Addr().Is4() == p.Addr().Is4() }) {
			d.lens = append(d.lens, p)
		}
	}
	for name, idx := range links {
		d.Name[name] = true
		if idx != 0 {
			d.Index[idx] = true
		}
	}
	return d
}

// Drift returns the rules as a Drift.
func (d OverlayDrift) Drift() Drift {
	return Drift{Link: d.Link, Addr: d.Addr, Neigh: d.Neigh, Route: d.Route}
}

// Link: any change to an overlay link.
func (d OverlayDrift) Link(u netlink.LinkUpdate) bool {
	return d.Index[int(u.Index)] || u.Link != nil && d.Name[u.Link.Attrs().Name]
}

// Addr: an address removed from an overlay link.
func (d OverlayDrift) Addr(u netlink.AddrUpdate) bool {
	return !u.NewAddr && d.Index[u.LinkIndex]
}

// Neigh: a wanted neighbour removed, changed (another MAC) or no longer
// permanent, or a permanent one that is not wanted. Bridge (FDB)
// notifications are not neighbours.
func (d OverlayDrift) Neigh(u netlink.NeighUpdate) bool {
	if !d.Index[u.LinkIndex] || u.Family == unix.AF_BRIDGE {
		return false
	}
	ip, _ := netip.AddrFromSlice(u.IP)
	ip = ip.Unmap()
	var mac subnet.MAC
	copy(mac[:], u.HardwareAddr)
	wantMAC, want := d.neighbour(ip)
	permanent := u.State&netlink.NUD_PERMANENT != 0
	switch {
	case u.Type == unix.RTM_DELNEIGH:
		return want
	case want:
		return !permanent || wantMAC != mac
	}
	return permanent
}

// neighbour returns the MAC the table wants for the neighbour ip: that of
// the subnet whose gateway ip is.
func (d OverlayDrift) neighbour(ip netip.Addr) (subnet.MAC, bool) {
	for _, l := range d.lens {
		if l.Addr().Is4() != ip.Is4() {
			continue
		}
		p, err := ip.Prefix(l.Bits())
		if err != nil || Gateway(p) != ip {
			continue
		}
		if v, ok := d.Routes[p]; ok {
			return v.MAC, true
		}
	}
	return subnet.MAC{}, false
}

// Route: a wanted route of weft's (on an overlay link or with
// RouteProtocol) removed, one of weft's that is not wanted or goes
// elsewhere, or another owner's route to a wanted subnet (it may have
// replaced weft's: a route of the same destination and metric does). Only
// the routes that Sync reads and repairs count: unicast routes of the main
// table that the kernel did not add itself. The kernel's own routes for the
// link's addresses (the IPv6 link-local address's, which appears a second
// after the link comes up, among them) are not drift: each used to cost a
// full sync of every peer right after start-up.
func (d OverlayDrift) Route(u netlink.RouteUpdate) bool {
	if u.Protocol == unix.RTPROT_KERNEL || u.Route.Type != unix.RTN_UNICAST ||
		(u.Table != 0 && u.Table != unix.RT_TABLE_MAIN) {
		return false
	}
	ours := d.Index[u.LinkIndex] || u.Protocol == RouteProtocol
	if u.Dst == nil {
		return ours && u.Type == unix.RTM_DELROUTE
	}
	ones, _ := u.Dst.Mask.Size()
	dst, _ := netip.AddrFromSlice(u.Dst.IP)
	p := netip.PrefixFrom(dst.Unmap(), ones)
	v, want := d.Routes[p]
	switch {
	case u.Type == unix.RTM_DELROUTE:
		return want && ours
	case !ours:
		return want
	}
	gw, _ := netip.AddrFromSlice(u.Gw)
	gw = gw.Unmap()
	return !want || (gw != Gateway(p) && gw != v.Addr)
}
