package uvxlan

import (
	"github.com/vishvananda/netlink"
	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/vtep"
)

// program makes the TAP's neighbours and routes match t with the shared
// backend.Overlay, as the kernel backend does for its VXLAN device, but with
// no FDB step: the dataplane maps the MAC to the underlay address itself.
// Peers whose underlay family differs from ours are left out: this
// backend's socket cannot reach them.
func (dp *datapath) program(t vtep.Table) error {
	if dp.overlay == nil {
		// One backend carries one family; a dual-stack node runs a second
		// backend whose routes this one must leave alone.
		fam := netlink.FAMILY_V4
		if dp.b.cfg.Local.Unmap().Is6() {
			fam = netlink.FAMILY_V6
		}
		dp.overlay = backend.NewOverlay(dp.h, dp.linkIndex, backend.OverlayOptions{Family: fam})
	}
	reachable := make(vtep.Table, len(t))
	for p, v := range t {
		if v.Addr.Unmap().Is6() == dp.b.cfg.Local.Is6() {
			reachable[p] = v
		}
	}
	st, err := dp.overlay.Sync(reachable)
	if st.Changed() {
		dp.b.log.Info("programmed peers", "peers", len(reachable), "neigh_set", st.NeighSet, "neigh_del", st.NeighDel,
			"route_set", st.RouteSet, "route_del", st.RouteDel)
	}
	return err
}
