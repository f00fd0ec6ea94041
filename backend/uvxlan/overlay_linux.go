package uvxlan

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/vtep"
	"golang.org/x/sys/unix"
)

// sync is the reconciler's Sync (kernel.Reconciler): it makes sure the TAP
// exists and is the one the packet loops use, puts back its MAC, MTU,
// address and up state, and programs the latest table's neighbours and
// routes. A full sync reads the kernel and repairs drift; otherwise only
// the difference from the table programmed last is written.
func (dp *datapath) sync(full bool) error {
	// One table for the whole sync: with the fast path, the table it
	// hands the packet loops must be the one it programs and reports
	// ready, or a Set during the sync (while the programs load) would
	// make the first sync of a run report ready with no peers for the
	// packet loops, which then drop the frames that waited in kept queues
	// (TestKeptFilesFastPathFirstTable). A later Set kicks the next sync.
	tp := dp.b.Table()
	// With the fast path, a new table reaches its maps and then the packet
	// loops here (see Set); maps that could not take every peer are
	// written again at each sync.
	if tp != nil && dp.b.fast != nil && (tp != dp.fastTable || dp.fastMapErr != "") {
		dp.syncFastPeers(*tp)
		if tp != dp.fastTable {
			dp.b.peers.Store(newPeers(*tp, dp.b.cfg.Port, dp.b.cfg.Local.Is6()))
			dp.fastTable = tp
		}
	}
	recreated, err := dp.ensureDevice()
	if err != nil {
		return err
	}
	fix, err := dp.configureLink()
	if err != nil {
		return err
	}
	if dp.programmed && !recreated {
		if fix.link {
			dp.b.ctr.link.Add(1)
			dp.b.log.Warn("repaired device settings (mac, mtu or up state)")
		}
		if fix.address {
			dp.b.ctr.address.Add(1)
			dp.b.log.Warn("repaired device address")
		}
	}
	// Before the peers: a replaced TAP needs the fast path on it even when
	// programming the routes fails.
	dp.syncFast()
	dp.syncBridge()
	if tp == nil {
		return nil
	}
	err = dp.program(*tp, full || recreated)
	dp.checkFastRoutes(full) // needs the peers' addresses only
	if err != nil {
		return err
	}
	dp.programmed = true
	dp.b.MarkReady()
	return nil
}

// ensureDevice opens the TAP again when it is gone, when the device of our
// name is not the one our queues are attached to (deleted and made again by
// someone else), or when a packet loop lost its queue. It reports whether it
// did.
func (dp *datapath) ensureDevice() (bool, error) {
	name := dp.b.cfg.Name
	l, err := dp.h.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	switch {
	case err == nil && l.Attrs().Index == dp.linkIndex && !dp.tapBroken.Load():
		return false, nil
	case err != nil && !errors.As(err, &notFound):
		return false, fmt.Errorf("find %s: %w", name, err)
	case err == nil:
		if _, ok := l.(*netlink.Tuntap); !ok {
			return false, fmt.Errorf("%s is a %s device, not weft's tap: remove it", name, l.Type())
		}
		// Ours to replace: a TAP of our name we are not attached to.
		if err := dp.h.LinkDel(l); err != nil {
			return false, fmt.Errorf("remove stale %s: %w", name, err)
		}
	}
	var qs []*tapQueue
	if err := inNS(dp.b.cfg.NetNS, func() (err error) { qs, err = dp.openTAP(); return err }); err != nil {
		return false, err
	}
	dp.swapTAP(qs)
	dp.overlay, dp.applied = nil, nil
	dp.b.ctr.device.Add(1)
	dp.b.log.Warn("repaired device: opened the tap again", "old_index", dp.linkIndex)
	return true, nil
}

// program makes the TAP's neighbours and routes match t with the shared
// kernel.Overlay, as the kernel backend does for its VXLAN device, but with
// no FDB step: the dataplane maps the MAC to the underlay address itself.
// Peers whose underlay family differs from ours are left out: this
// backend's socket cannot reach them (a dual-stack node runs a second
// backend, whose routes this one must leave alone).
func (dp *datapath) program(t vtep.Table, full bool) error {
	if dp.overlay == nil {
		fam := netlink.FAMILY_V4
		if dp.b.cfg.Local.Is6() {
			fam = netlink.FAMILY_V6
		}
		dp.overlay = kernel.NewOverlay(dp.h, dp.linkIndex, kernel.OverlayOptions{Family: fam})
	}
	reachable := make(vtep.Table, len(t))
	for p, v := range t {
		if v.Addr.Unmap().Is6() == dp.b.cfg.Local.Is6() {
			reachable[p] = v
		}
	}
	var st kernel.SyncStats
	var err error
	if !full && dp.applied != nil {
		st, err = dp.overlay.Apply(dp.applied, reachable)
	} else {
		st, err = dp.overlay.Sync(reachable)
		if st.Changed() && dp.applied != nil && maps.Equal(dp.applied, reachable) {
			dp.b.ctr.neigh.Add(uint64(st.NeighSet + st.NeighDel))
			dp.b.ctr.route.Add(uint64(st.RouteSet + st.RouteDel))
			dp.b.log.Warn("repaired drift", "neigh", st.NeighSet+st.NeighDel, "route", st.RouteSet+st.RouteDel)
		}
	}
	if err != nil {
		return fmt.Errorf("program peers on %s: %w", dp.b.cfg.Name, err)
	}
	if st.Changed() {
		dp.b.log.Info("programmed peers", "peers", len(reachable), "neigh_set", st.NeighSet, "neigh_del", st.NeighDel,
			"route_set", st.RouteSet, "route_del", st.RouteDel)
	}
	dp.applied = reachable
	return nil
}

// drift is the reconciler's Drift: the shared overlay rules for the TAP and
// the table programmed last.
func (dp *datapath) drift() kernel.Drift {
	d := kernel.NewOverlayDrift(dp.applied, map[string]int{dp.b.cfg.Name: dp.linkIndex}).Drift()
	if f := dp.b.fast; f != nil {
		// The fast path's egress program sends through the underlay
		// device by its index: a change to that device, or the node's
		// address coming or going on any device (a recreated underlay),
		// calls for a sync, which attaches the programs again.
		under, local := f.params.underlay, dp.b.cfg.Local
		link, addr := d.Link, d.Addr
		d.Link = func(u netlink.LinkUpdate) bool { return link(u) || under != 0 && int(u.Index) == under }
		d.Addr = func(u netlink.AddrUpdate) bool {
			a, ok := netip.AddrFromSlice(u.LinkAddress.IP)
			return addr(u) || ok && a.Unmap() == local
		}
		// The pod bridge made (or made anew) calls for a sync that
		// attaches the bridge program; its forwarding database's changes
		// go into the ports map as they come.
		bridge, tried, withLink := dp.b.cfg.PodBridge, dp.bridgeTried, d.Link
		d.Link = func(u netlink.LinkUpdate) bool {
			switch {
			case withLink(u):
				return true
			case !f.attached:
				return false
			case u.Header.Type == unix.RTM_DELLINK && f.brLink != nil && int(u.Index) == f.brIndex:
				f.detachBridge() // a bridge made anew may get the same index
				return true
			}
			return u.Header.Type == unix.RTM_NEWLINK && u.Attrs().Name == bridge && int(u.Index) != f.brIndex && int(u.Index) != tried
		}
		neigh := d.Neigh
		d.Neigh = func(u netlink.NeighUpdate) bool {
			if u.Family == unix.AF_BRIDGE {
				f.portUpdate(u)
				return false
			}
			return neigh != nil && neigh(u)
		}
	}
	return d
}
