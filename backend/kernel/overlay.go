package kernel

import (
	"net/netip"
	"slices"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// This file holds the pure half of the per-peer programming that every
// overlay link shares (see Overlay in overlay_linux.go): what the kernel
// should hold for a table, and the plan that turns what it holds into that.
// It touches no kernel, so it is table-tested cheaply.

// Gateway is the address that stands for a remote node subnet on the overlay
// link: the subnet's first address (10.244.7.0 for 10.244.7.0/24, fd00:7::
// for fd00:7::/64). Each node puts it on its own overlay device, and peers
// hold a permanent neighbour for it, so the route to the subnet needs no ARP
// or neighbour discovery on the wire. Flannel uses the same address.
func Gateway(p netip.Prefix) netip.Addr { return p.Masked().Addr() }

// Neighbour is a permanent neighbour entry on the overlay link.
type Neighbour struct {
	IP  netip.Addr
	MAC subnet.MAC
}

// Route is a route to a remote node subnet. A tunnelled route has
// OnLink set and goes out of the overlay link via Gateway(Dst); a direct route
// (DirectRouting) goes via the peer's underlay address and leaves OnLink unset.
type Route struct {
	Dst       netip.Prefix
	Gw        netip.Addr
	LinkIndex int
	OnLink    bool
	Priority  int // metric: the kernel's default (0 for IPv4, 1024 for IPv6), as Flannel's routes have
	// Protocol is the route's protocol as read from the kernel (0 in a
	// wanted route: weft writes RouteProtocol). A deletion names it, with
	// the link and gateway read, so that it removes exactly the route read
	// and never another owner's route to the same subnet.
	Protocol int
}

// Peer is one row of the desired table, with whether its subnet is reached
// directly over the underlay (DirectRouting and the peer is on-link) rather
// than through the tunnel.
type Peer struct {
	vtep.Entry
	Direct bool
}

// Programmed is the overlay state found in the kernel: the permanent
// neighbours on the overlay link, and the routes weft owns (on the overlay
// link, or carrying weft's route protocol for direct routes).
type Programmed struct {
	Neighbours []Neighbour
	Routes     []Route
}

// defaultMetric is the metric the kernel gives a route added with none: 0
// for IPv4, 1024 for IPv6.
func defaultMetric(p netip.Prefix) int {
	if p.Addr().Is4() {
		return 0
	}
	return 1024
}

// wantRoute is the route that carries p's subnet: tunnelled or direct, it
// has the kernel's default metric, as Flannel's routes do.
func wantRoute(p Peer, link int) Route {
	if p.Direct {
		return Route{Dst: p.Subnet, Gw: p.Peer.Addr, Priority: defaultMetric(p.Subnet)}
	}
	return Route{Dst: p.Subnet, Gw: Gateway(p.Subnet), LinkIndex: link, OnLink: true, Priority: defaultMetric(p.Subnet)}
}

// matches reports whether the kernel route have carries the wanted route.
// A direct route may leave by whatever link the kernel chose. A route of
// another metric does not match (weft releases before this one gave each
// tunnelled IPv4 route a metric of its own): the right one is added beside
// it and it is deleted.
func (want Route) matches(have Route) bool {
	if want.Dst != have.Dst || want.Gw != have.Gw || have.Priority != want.Priority {
		return false
	}
	if want.OnLink {
		return have.OnLink && have.LinkIndex == want.LinkIndex
	}
	return true
}

// syncPlan is the ordered work of one sync, in the order it is applied:
//
//  1. DelRoutes whose subnet left the table (a removed peer loses its route
//     before anything else, so no packet is routed into a half-removed peer);
//  2. SetNeighbours (create or replace);
//  3. the PeerStep's Ensure (the vxlan FDB entries);
//  4. SetRoutes (replace), then DelWrongRoutes, routes for a subnet that is
//     still in the table but no longer as they should be (another gateway,
//     another metric, DirectRouting switched): deleted after the right one
//     is in;
//  5. the PeerStep's Prune;
//  6. DelNeighbours that belong to no tunnelled peer.
//
// Per peer that is neighbour → step → route on the way in and route → step →
// neighbour on the way out, as Flannel does it.
type syncPlan struct {
	DelRoutes      []Route
	SetNeighbours  []Neighbour
	SetRoutes      []Route
	DelWrongRoutes []Route
	DelNeighbours  []Neighbour
}

func (p syncPlan) empty() bool {
	return len(p.DelRoutes)+len(p.SetNeighbours)+len(p.SetRoutes)+len(p.DelWrongRoutes)+len(p.DelNeighbours) == 0
}

// plan computes what turns have into want on the overlay link with index
// link. It is pure.
func plan(want []Peer, have Programmed, link int) syncPlan {
	var sp syncPlan
	wantRoutes := make(map[netip.Prefix]Route, len(want))
	wantNeigh := make(map[netip.Addr]subnet.MAC, len(want))
	for _, p := range want {
		wantRoutes[p.Subnet] = wantRoute(p, link)
		if !p.Direct {
			wantNeigh[Gateway(p.Subnet)] = p.Peer.MAC
		}
	}
	haveNeigh := make(map[netip.Addr]subnet.MAC, len(have.Neighbours))
	for _, n := range have.Neighbours {
		haveNeigh[n.IP] = n.MAC
		if _, ok := wantNeigh[n.IP]; !ok {
			sp.DelNeighbours = append(sp.DelNeighbours, n)
		}
	}
	good := make(map[netip.Prefix]bool, len(want))
	for _, r := range have.Routes {
		w, ok := wantRoutes[r.Dst]
		switch {
		case !ok:
			sp.DelRoutes = append(sp.DelRoutes, r)
		case w.matches(r):
			good[r.Dst] = true
		default:
			sp.DelWrongRoutes = append(sp.DelWrongRoutes, r)
		}
	}
	for _, p := range want {
		if !p.Direct {
			ip := Gateway(p.Subnet)
			if mac, ok := haveNeigh[ip]; !ok || mac != p.Peer.MAC {
				sp.SetNeighbours = append(sp.SetNeighbours, Neighbour{IP: ip, MAC: p.Peer.MAC})
			}
		}
		if !good[p.Subnet] {
			sp.SetRoutes = append(sp.SetRoutes, wantRoutes[p.Subnet])
		}
	}
	byIP := func(a, b Neighbour) int { return a.IP.Compare(b.IP) }
	slices.SortFunc(sp.SetNeighbours, byIP)
	slices.SortFunc(sp.DelNeighbours, byIP)
	byDst := func(a, b Route) int {
		if c := a.Dst.Addr().Compare(b.Dst.Addr()); c != 0 {
			return c
		}
		return a.Dst.Bits() - b.Dst.Bits()
	}
	slices.SortFunc(sp.DelRoutes, byDst)
	slices.SortFunc(sp.SetRoutes, byDst)
	slices.SortFunc(sp.DelWrongRoutes, byDst)
	return sp
}
