package vxlan

import (
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/subnet"
)

// drift is the shared overlay drift rules for the devices and the table
// last programmed, plus the FDB entries: one that the table wants deleted
// or no longer permanent, or a new permanent one that it does not want.
func (b *Backend) drift() kernel.Drift {
	links := make(map[string]int, len(b.devs))
	for _, d := range b.devs {
		links[d.spec.name] = d.index
	}
	od := kernel.NewOverlayDrift(b.peers.want, links)
	fdb := b.peers.fdb
	dr := od.Drift()
	dr.Neigh = func(u netlink.NeighUpdate) bool {
		if u.Family != unix.AF_BRIDGE {
			return od.Neigh(u)
		}
		if !od.Index[u.LinkIndex] {
			return false
		}
		ip, _ := netip.AddrFromSlice(u.IP)
		var mac subnet.MAC
		copy(mac[:], u.HardwareAddr)
		want := fdb[fdbEntry{MAC: mac, Dst: ip.Unmap()}] > 0
		permanent := u.State&netlink.NUD_PERMANENT != 0
		switch {
		case u.Type == unix.RTM_DELNEIGH:
			return want
		case want:
			return !permanent
		}
		return permanent
	}
	return dr
}
