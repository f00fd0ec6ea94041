package vxlan

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// fdb is the kernel.PeerStep that writes, per tunnelled peer, the VXLAN FDB
// entry `<VtepMAC> dst <PublicIP> self permanent` on the device.
type fdb struct {
	h    *netlink.Handle
	link int
}

var _ kernel.PeerStep = fdb{}

// fdbEntry is one permanent FDB entry with a remote address.
type fdbEntry struct {
	MAC subnet.MAC
	Dst netip.Addr
}

// list returns the device's permanent FDB entries that have a remote
// address; learned (non-permanent) entries are not weft's.
func (f fdb) list() (map[fdbEntry]bool, error) {
	ns, err := kernel.ListNeighbours(f.h, f.link, unix.AF_BRIDGE)
	if err != nil {
		return nil, fmt.Errorf("list fdb: %w", err)
	}
	out := make(map[fdbEntry]bool, len(ns))
	for _, n := range ns {
		if n.LinkIndex != f.link || n.State&netlink.NUD_PERMANENT == 0 || len(n.HardwareAddr) != 6 {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		out[fdbEntry{MAC: subnet.MAC(n.HardwareAddr), Dst: ip.Unmap()}] = true
	}
	return out, nil
}

func (f fdb) neigh(e fdbEntry) *netlink.Neigh {
	return &netlink.Neigh{
		LinkIndex:    f.link,
		Family:       unix.AF_BRIDGE,
		Flags:        netlink.NTF_SELF,
		State:        netlink.NUD_PERMANENT,
		IP:           e.Dst.AsSlice(),
		HardwareAddr: e.MAC.HardwareAddr(),
	}
}

// Ensure writes the entries of peers that are missing. Replacing an entry
// of the same MAC points it at the new address.
func (f fdb) Ensure(peers []vtep.Entry) (int, error) {
	have, err := f.list()
	if err != nil {
		return 0, err
	}
	var missing []fdbEntry
	for _, p := range peers {
		if e := (fdbEntry{MAC: p.Peer.MAC, Dst: p.Peer.Addr}); !have[e] {
			missing = append(missing, e)
		}
	}
	return f.write(missing, true)
}

// write sets or deletes es, one request each, and returns how many it
// wrote. A missing entry is no error for a delete.
func (f fdb) write(es []fdbEntry, set bool) (int, error) {
	n := 0
	for _, e := range es {
		var err error
		if set {
			err = f.h.NeighSet(f.neigh(e))
		} else {
			err = f.h.NeighDel(f.neigh(e))
		}
		switch {
		case err == nil:
			n++
		case set:
			return n, fmt.Errorf("set fdb %s dst %s: %w", e.MAC, e.Dst, err)
		case !errors.Is(err, unix.ENOENT): // ENOENT: replaced by Ensure
			return n, fmt.Errorf("delete fdb %s dst %s: %w", e.MAC, e.Dst, err)
		}
	}
	return n, nil
}

// Prune removes permanent entries that belong to none of peers: those of a
// removed peer, and the old entry of a peer whose MAC or address changed.
func (f fdb) Prune(peers []vtep.Entry) (int, error) {
	have, err := f.list()
	if err != nil {
		return 0, err
	}
	want := make(map[fdbEntry]bool, len(peers))
	for _, p := range peers {
		want[fdbEntry{MAC: p.Peer.MAC, Dst: p.Peer.Addr}] = true
	}
	var stale []fdbEntry
	for e := range have {
		if !want[e] {
			stale = append(stale, e)
		}
	}
	return f.write(stale, false)
}

var _ kernel.EntryStep = fdb{}

// Add writes one peer's entry (replacing an entry of the same MAC).
func (f fdb) Add(p vtep.Entry) error {
	e := fdbEntry{MAC: p.Peer.MAC, Dst: p.Peer.Addr}
	if err := f.h.NeighSet(f.neigh(e)); err != nil {
		return fmt.Errorf("set fdb %s dst %s: %w", e.MAC, e.Dst, err)
	}
	return nil
}

// Remove deletes one peer's entry; a missing entry is no error.
func (f fdb) Remove(p vtep.Entry) error {
	e := fdbEntry{MAC: p.Peer.MAC, Dst: p.Peer.Addr}
	if err := f.h.NeighDel(f.neigh(e)); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete fdb %s dst %s: %w", e.MAC, e.Dst, err)
	}
	return nil
}
