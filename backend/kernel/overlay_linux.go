package kernel

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// RouteProtocol marks the routes weft installs (the rtm_protocol field,
// shown by `ip route` as "proto 87"). Direct routes (DirectRouting) leave by
// the underlay link, which weft does not own; the protocol is how weft finds
// its own among them to adopt them after a restart or remove them when stale.
const RouteProtocol netlink.RouteProtocol = 87

// dumpRetries bounds the retries of a netlink dump that the kernel
// interrupted because the table changed under it.
const dumpRetries = 10

// PeerStep is a dataplane-specific entry per tunnelled peer that must exist
// after the peer's neighbour and before its route, and go after the route and
// before the neighbour: the vxlan backend's FDB entry (`<VtepMAC> dst
// <PublicIP>`). A TAP-based dataplane needs none.
//
// Both methods receive every tunnelled peer of the table (never the directly
// routed ones) and must be idempotent. Ensure creates or replaces what is
// missing or wrong and never removes anything; Prune removes the step's
// entries that belong to none of the peers. Each returns how many kernel
// entries it wrote or removed.
type PeerStep interface {
	Ensure(peers []vtep.Entry) (int, error)
	Prune(peers []vtep.Entry) (int, error)
}

// OverlayOptions tunes an Overlay.
type OverlayOptions struct {
	// Family restricts the overlay to IPv4 (netlink.FAMILY_V4) or IPv6
	// (netlink.FAMILY_V6) subnets; netlink.FAMILY_ALL handles both. Entries
	// of other families in a table are ignored, and so is kernel state of
	// other families: two Overlays of different families may share a
	// namespace (the vxlan backend has one device per family).
	Family int
	// DirectRouting routes a peer whose underlay address is on-link (the
	// kernel reaches it with no gateway) straight over the underlay, via its
	// underlay address, with no neighbour, no step and no encapsulation.
	DirectRouting bool
	// DirectOnly (with DirectRouting) programs nothing but direct routes:
	// a peer that is not on-link gets no route at all and is listed by
	// OffLink instead, and the overlay owns no link, so it reads and
	// removes no neighbours and only weft's own routes (RouteProtocol).
	// This is the host-gw backend, whose "overlay" is the underlay itself.
	DirectOnly bool
	// Step, if not nil, is run between neighbours and routes.
	Step PeerStep
}

// Overlay programs, on one overlay link (a VXLAN device or a TAP), the
// per-peer state that makes the kernel route pod traffic to a remote node
// subnet into that link with the right destination MAC:
//
//	ip neigh replace <subnet>.0 lladdr <VtepMAC> dev <link> nud permanent
//	(step, for example the vxlan FDB entry)
//	ip route replace <subnet> via <subnet>.0 dev <link> onlink proto 87
//
// (IPv6: `<subnet>::` instead of `<subnet>.0`), with the kernel's default
// metric, as Flannel's routes have. The frame that leaves the link is
// addressed to the peer's VTEP MAC; a VXLAN device then finds the peer's
// underlay address in its FDB, a TAP dataplane in its own table.
//
// Sync is declarative: it reads what the kernel holds on the link, adopts
// whatever already matches (no flush, so a restarted daemon drops nothing),
// replaces what is wrong, and removes weft's stale entries: permanent
// neighbours on the link, and weft's routes (on the link, or with
// RouteProtocol) whose subnet is not in the table or that are not as wanted
// (another gateway, another metric). It never touches other links'
// neighbours or other owners' routes. Calling Sync again with the same
// table repairs drift (a deleted route or neighbour) and otherwise does
// nothing.
//
// An Overlay is not safe for concurrent use; the handle may be shared.
type Overlay struct {
	h       *netlink.Handle
	link    int
	opts    OverlayOptions
	offLink []vtep.Entry
}

// OffLink returns the peers the last Sync left out because, with
// DirectOnly, they are not on-link. The slice is not modified afterwards.
func (o *Overlay) OffLink() []vtep.Entry { return o.offLink }

// NewOverlay returns the programmer for the link with index linkIndex, using
// h (bound to the link's namespace).
func NewOverlay(h *netlink.Handle, linkIndex int, opts OverlayOptions) *Overlay {
	return &Overlay{h: h, link: linkIndex, opts: opts}
}

// SyncStats counts the kernel entries one Sync wrote (created or replaced)
// and removed, by kind. Step counts what the PeerStep reported.
type SyncStats struct {
	NeighSet, NeighDel int
	RouteSet, RouteDel int
	StepSet, StepDel   int
}

// Changed reports whether the sync touched the kernel at all.
func (s SyncStats) Changed() bool { return s != SyncStats{} }

// Sync makes the link's per-peer state match t (see Overlay). On error it
// stops at the first failing step; calling it again continues.
func (o *Overlay) Sync(t vtep.Table) (SyncStats, error) {
	var st SyncStats
	have, err := o.Programmed()
	if err != nil {
		return st, err
	}
	peers, err := o.peers(t)
	if err != nil {
		return st, err
	}
	sp := plan(peers, have, o.link)
	tunnelled := make([]vtep.Entry, 0, len(peers))
	for _, p := range peers {
		if !p.Direct {
			tunnelled = append(tunnelled, p.Entry)
		}
	}
	if err := o.delRoutes(sp.DelRoutes, &st); err != nil {
		return st, err
	}
	if err := o.setNeighbours(sp.SetNeighbours, &st); err != nil {
		return st, err
	}
	if err := o.step(tunnelled, true, &st); err != nil {
		return st, err
	}
	if err := o.setRoutes(sp.SetRoutes, &st); err != nil {
		return st, err
	}
	if err := o.delRoutes(sp.DelWrongRoutes, &st); err != nil {
		return st, err
	}
	if err := o.step(tunnelled, false, &st); err != nil {
		return st, err
	}
	return st, o.delNeighbours(sp.DelNeighbours, &st)
}

func (o *Overlay) setNeighbours(ns []Neighbour, st *SyncStats) error {
	for _, n := range ns {
		if err := o.h.NeighSet(o.neigh(n)); err != nil {
			return fmt.Errorf("set neighbour %s lladdr %s: %w", n.IP, n.MAC, err)
		}
		st.NeighSet++
	}
	return nil
}

func (o *Overlay) delNeighbours(ns []Neighbour, st *SyncStats) error {
	for _, n := range ns {
		err := o.h.NeighDel(o.neigh(n))
		switch {
		case err == nil:
			st.NeighDel++
		case !errors.Is(err, unix.ENOENT):
			return fmt.Errorf("delete neighbour %s: %w", n.IP, err)
		}
	}
	return nil
}

// step runs the PeerStep's Ensure (or Prune), if there is a step.
func (o *Overlay) step(peers []vtep.Entry, ensure bool, st *SyncStats) error {
	if o.opts.Step == nil {
		return nil
	}
	if ensure {
		n, err := o.opts.Step.Ensure(peers)
		st.StepSet += n
		return err
	}
	n, err := o.opts.Step.Prune(peers)
	st.StepDel += n
	return err
}

func (o *Overlay) setRoutes(rs []Route, st *SyncStats) error {
	for _, r := range rs {
		nr := o.route(r)
		nr.Protocol = RouteProtocol
		if err := o.h.RouteReplace(nr); err != nil {
			return fmt.Errorf("replace route %s via %s: %w", r.Dst, r.Gw, err)
		}
		st.RouteSet++
	}
	return nil
}

func (o *Overlay) delRoutes(rs []Route, st *SyncStats) error {
	for _, r := range rs {
		nr := o.route(r)
		nr.Scope = netlink.SCOPE_NOWHERE // any scope: a stray route may be scope link
		err := o.h.RouteDel(nr)
		switch {
		case err == nil:
			st.RouteDel++
		case !errors.Is(err, unix.ESRCH): // ESRCH: already gone (replaced in place)
			return fmt.Errorf("delete route %s via %s: %w", r.Dst, r.Gw, err)
		}
	}
	return nil
}

// peers selects t's entries of the overlay's family and decides which are
// routed directly.
func (o *Overlay) peers(t vtep.Table) ([]Peer, error) {
	out := make([]Peer, 0, len(t))
	var off []vtep.Entry
	for _, e := range t.Entries() {
		if !o.carries(e.Subnet, e.Peer) {
			continue
		}
		p := Peer{Entry: e}
		if o.opts.DirectRouting {
			on, err := OnLink(o.h, e.Peer.Addr)
			if err != nil {
				return nil, err
			}
			p.Direct = on
		}
		if o.opts.DirectOnly && !p.Direct {
			off = append(off, e)
			continue
		}
		out = append(out, p)
	}
	o.offLink = off
	return out, nil
}

// carries reports whether a table row is this overlay's: a subnet of its
// family behind an underlay address of the same family.
func (o *Overlay) carries(p netip.Prefix, v vtep.Peer) bool {
	return o.wants(p.Addr()) && p.Addr().Is4() == v.Addr.Is4()
}

func (o *Overlay) wants(a netip.Addr) bool {
	switch o.opts.Family {
	case netlink.FAMILY_V4:
		return a.Is4()
	case netlink.FAMILY_V6:
		return a.Is6()
	}
	return true
}

func (o *Overlay) families() []int {
	if o.opts.Family == netlink.FAMILY_ALL {
		return []int{netlink.FAMILY_V4, netlink.FAMILY_V6}
	}
	return []int{o.opts.Family}
}

// OnLink reports whether the kernel reaches addr with no gateway, that is,
// addr is on a directly connected subnet (DirectRouting's condition).
func OnLink(h *netlink.Handle, addr netip.Addr) (bool, error) {
	rs, err := h.RouteGet(addr.AsSlice())
	if err != nil {
		if errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) {
			return false, nil
		}
		return false, fmt.Errorf("get route to %s: %w", addr, err)
	}
	return len(rs) == 1 && rs[0].Gw == nil && rs[0].Type == unix.RTN_UNICAST, nil
}

// Programmed returns the overlay state the kernel holds now: the permanent
// neighbours on the link and weft's routes (on the link, or direct routes
// with RouteProtocol) in the main table, of the overlay's family. Routes the
// kernel adds by itself (proto kernel) are left out. It reads one neighbour
// and one route dump per family.
func (o *Overlay) Programmed() (Programmed, error) {
	var p Programmed
	for _, fam := range o.families() {
		if !o.opts.DirectOnly {
			ns, err := ListNeighbours(o.h, o.link, fam)
			if err != nil {
				return p, err
			}
			for _, n := range ns {
				if n.State&netlink.NUD_PERMANENT == 0 {
					continue
				}
				ip, ok := netip.AddrFromSlice(n.IP)
				if !ok || len(n.HardwareAddr) != 6 {
					continue
				}
				p.Neighbours = append(p.Neighbours, Neighbour{IP: ip.Unmap(), MAC: subnet.MAC(n.HardwareAddr)})
			}
		}
		rs, err := o.listRoutes(fam)
		if err != nil {
			return p, err
		}
		p.Routes = append(p.Routes, rs...)
	}
	return p, nil
}

// listRoutes returns weft's unicast routes of family in the main table: on
// the link or with RouteProtocol (with DirectOnly, only the latter).
func (o *Overlay) listRoutes(fam int) ([]Route, error) {
	filter, mask := &netlink.Route{Table: unix.RT_TABLE_MAIN}, uint64(netlink.RT_FILTER_TABLE)
	if o.opts.DirectOnly {
		filter.Protocol, mask = RouteProtocol, mask|netlink.RT_FILTER_PROTOCOL
	}
	var out []Route
	err := retryDump(func() error {
		out = out[:0]
		return o.h.RouteListFilteredIter(fam, filter, mask, func(r netlink.Route) bool {
			ours := r.Protocol == RouteProtocol || !o.opts.DirectOnly && r.LinkIndex == o.link
			if ours && r.Protocol != unix.RTPROT_KERNEL && r.Dst != nil && r.Type == unix.RTN_UNICAST {
				out = append(out, fromNetlinkRoute(r))
			}
			return true
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	return out, nil
}

func fromNetlinkRoute(r netlink.Route) Route {
	ones, _ := r.Dst.Mask.Size()
	dst, _ := netip.AddrFromSlice(r.Dst.IP)
	gw, _ := netip.AddrFromSlice(r.Gw)
	return Route{
		Dst:       netip.PrefixFrom(dst.Unmap(), ones),
		Gw:        gw.Unmap(),
		LinkIndex: r.LinkIndex,
		OnLink:    r.Flags&int(netlink.FLAG_ONLINK) != 0,
		Priority:  r.Priority,
		Protocol:  int(r.Protocol),
	}
}

func (o *Overlay) neigh(n Neighbour) *netlink.Neigh {
	fam := netlink.FAMILY_V4
	if n.IP.Is6() {
		fam = netlink.FAMILY_V6
	}
	return &netlink.Neigh{
		LinkIndex:    o.link,
		Family:       fam,
		State:        netlink.NUD_PERMANENT,
		Type:         unix.RTN_UNICAST,
		IP:           n.IP.AsSlice(),
		HardwareAddr: n.MAC.HardwareAddr(),
	}
}

// route is r for netlink: for a route read from the kernel, exactly that
// route (its gateway, link and protocol; a deletion matches only it), for a
// wanted one what to write (RouteReplace callers set RouteProtocol; a direct
// route leaves the link to the kernel).
func (o *Overlay) route(r Route) *netlink.Route {
	nr := &netlink.Route{
		Dst:       PrefixIPNet(r.Dst),
		Table:     unix.RT_TABLE_MAIN,
		Priority:  r.Priority,
		LinkIndex: r.LinkIndex,
		Protocol:  netlink.RouteProtocol(r.Protocol),
	}
	if r.Gw.IsValid() {
		nr.Gw = r.Gw.AsSlice()
	}
	if r.OnLink {
		nr.Flags = int(netlink.FLAG_ONLINK)
	}
	return nr
}

// PrefixIPNet converts p to the *net.IPNet netlink expects.
func PrefixIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// retryDump runs dump again, up to dumpRetries times, while it fails with
// netlink.ErrDumpInterrupted (the kernel's table changed during the dump,
// so what it returned may be inconsistent).
func retryDump(dump func() error) error {
	var err error
	for range dumpRetries {
		if err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return err
		}
	}
	return err
}

// ListNeighbours dumps the neighbours of family on the link, retrying a dump
// the kernel interrupted (netlink.ErrDumpInterrupted).
func ListNeighbours(h *netlink.Handle, linkIndex, family int) ([]netlink.Neigh, error) {
	var ns []netlink.Neigh
	err := retryDump(func() (err error) { ns, err = h.NeighList(linkIndex, family); return err })
	if err != nil {
		return nil, fmt.Errorf("list neighbours of link %d: %w", linkIndex, err)
	}
	return ns, nil
}

// ListRoutes is h.RouteListFiltered retried on netlink.ErrDumpInterrupted.
func ListRoutes(h *netlink.Handle, family int, filter *netlink.Route, mask uint64) ([]netlink.Route, error) {
	var rs []netlink.Route
	err := retryDump(func() (err error) { rs, err = h.RouteListFiltered(family, filter, mask); return err })
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	return rs, nil
}

// ListLinks is h.LinkList retried on netlink.ErrDumpInterrupted.
func ListLinks(h *netlink.Handle) ([]netlink.Link, error) {
	var ls []netlink.Link
	err := retryDump(func() (err error) { ls, err = h.LinkList(); return err })
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	return ls, nil
}

// ListAddrs is h.AddrList retried on netlink.ErrDumpInterrupted.
func ListAddrs(h *netlink.Handle, link netlink.Link, family int) ([]netlink.Addr, error) {
	var as []netlink.Addr
	err := retryDump(func() (err error) { as, err = h.AddrList(link, family); return err })
	if err != nil {
		return nil, fmt.Errorf("list addresses of %s: %w", link.Attrs().Name, err)
	}
	return as, nil
}
