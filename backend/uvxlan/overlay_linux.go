package uvxlan

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/weft-net/weft/vtep"
	"golang.org/x/sys/unix"
)

// program makes the TAP's neighbours and routes match t, as the kernel
// backend does for its VXLAN device: per peer a permanent neighbour
// <subnet>.0 lladdr <VtepMAC> and a route <subnet> via <subnet>.0 onlink;
// entries of peers no longer in t are removed. There is no FDB: the
// dataplane maps the MAC to the underlay address itself.
//
// This is a private stand-in until the shared neighbour and route code of
// package backend exists.
func (dp *datapath) program(t vtep.Table) error {
	var errs []error
	wantNeigh := make(map[netip.Addr]bool, len(t))
	wantRoute := make(map[netip.Prefix]bool, len(t))
	for _, e := range t.Entries() {
		if e.VTEP.Addr.Unmap().Is6() != dp.b.cfg.Local.Is6() {
			continue // unreachable over this backend's socket family
		}
		gw := subnetAddr(e.Subnet)
		n := &netlink.Neigh{
			LinkIndex: dp.linkIndex, Family: family(gw), State: netlink.NUD_PERMANENT,
			IP: gw.AsSlice(), HardwareAddr: e.VTEP.MAC.HardwareAddr(),
		}
		if err := dp.h.NeighSet(n); err != nil {
			errs = append(errs, fmt.Errorf("set neighbour %s: %w", gw, err))
			continue
		}
		r := &netlink.Route{LinkIndex: dp.linkIndex, Dst: ipNet(e.Subnet.Masked()), Gw: gw.AsSlice(), Flags: int(netlink.FLAG_ONLINK)}
		if err := dp.h.RouteReplace(r); err != nil {
			errs = append(errs, fmt.Errorf("replace route %s: %w", e.Subnet, err))
			continue
		}
		wantNeigh[gw] = true
		wantRoute[e.Subnet.Masked()] = true
	}
	errs = append(errs, dp.pruneRoutes(wantRoute), dp.pruneNeighs(wantNeigh))
	return errors.Join(errs...)
}

// pruneRoutes deletes our gateway routes on the TAP that are not wanted.
func (dp *datapath) pruneRoutes(want map[netip.Prefix]bool) error {
	var errs []error
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		routes, err := dp.h.RouteListFiltered(fam, &netlink.Route{LinkIndex: dp.linkIndex}, netlink.RT_FILTER_OIF)
		if err != nil {
			errs = append(errs, fmt.Errorf("list routes: %w", err))
			continue
		}
		for _, r := range routes {
			if r.Gw == nil || r.Dst == nil {
				continue
			}
			p, ok := prefixOf(r.Dst)
			if ok && !want[p] {
				if err := dp.h.RouteDel(&r); err != nil {
					errs = append(errs, fmt.Errorf("delete route %s: %w", p, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// pruneNeighs deletes permanent neighbours on the TAP that are not wanted.
func (dp *datapath) pruneNeighs(want map[netip.Addr]bool) error {
	var errs []error
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		neighs, err := dp.h.NeighList(dp.linkIndex, fam)
		if err != nil {
			errs = append(errs, fmt.Errorf("list neighbours: %w", err))
			continue
		}
		for _, n := range neighs {
			a, ok := netip.AddrFromSlice(n.IP)
			if !ok || n.State&netlink.NUD_PERMANENT == 0 || want[a.Unmap()] {
				continue
			}
			if err := dp.h.NeighDel(&n); err != nil {
				errs = append(errs, fmt.Errorf("delete neighbour %s: %w", a, err))
			}
		}
	}
	return errors.Join(errs...)
}

func family(a netip.Addr) int {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	bits, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), bits).Masked(), true
}
