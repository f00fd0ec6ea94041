package uvxlan

import (
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/weft-net/weft/backend/kernel"
	"golang.org/x/sys/unix"
)

// The fast path's third program sits on the pod bridge's egress
// (Config.PodBridge) and sends the super-packets the node routes to a pod
// straight to the pod's port (bpf/fastpath.c, weft_fp_bridge); the ports
// map it reads follows the bridge's forwarding database. Without the
// bridge, or with the other programs detached, it is not attached and
// the bridge carries everything.

// syncBridge is part of the reconciler's sync, after syncFast: it attaches
// the bridge program to the pod bridge's egress (again when the bridge was
// made anew) and writes the bridge's forwarding database into the ports
// map. A failure is logged once per reason: without the program the bridge
// segments the super-packets itself, which is slower but correct, and a
// MAC missing from the map goes through the bridge.
func (dp *datapath) syncBridge() {
	f := dp.b.fast
	if f == nil {
		return
	}
	index, err := dp.podBridge()
	dp.bridgeTried = index
	if err == nil && index != 0 && f.attached {
		err = dp.bridgeUp(index)
	} else {
		f.detachBridge()
	}
	if err != nil {
		if errors.Is(err, errLoad) {
			dp.b.ctr.fastLoadErrors.Add(1)
		}
		if msg := err.Error(); msg != dp.bridgeErr {
			dp.bridgeErr = msg
			dp.b.log.Warn("fast path: the pod bridge segments some tunnelled super-packets itself", "bridge", dp.b.cfg.PodBridge, "err", err)
		}
		return
	}
	dp.bridgeErr = ""
}

// bridgeUp attaches the bridge program to the bridge of this index, if it
// is not there, and loads the ports map. A program that cannot be
// attached is detached; a map that cannot be loaded leaves it attached.
func (dp *datapath) bridgeUp(index int) error {
	f := dp.b.fast
	var attached bool
	if err := inNS(dp.b.cfg.NetNS, func() (err error) { attached, err = f.attachBridge(index); return err }); err != nil {
		f.detachBridge()
		return err
	}
	err := f.loadPorts(dp.h, index)
	if attached {
		dp.b.log.Info("fast path attached to the pod bridge", "bridge", dp.b.cfg.PodBridge, "index", index, "ports", len(f.portKeys))
	}
	return err
}

// podBridge returns the index of the pod bridge, or 0 when there is none
// (before the CNI plugin's first pod makes it). A bridge that filters by
// VLAN is refused: the ports map knows MACs, not VLANs.
func (dp *datapath) podBridge() (int, error) {
	l, err := dp.h.LinkByName(dp.b.cfg.PodBridge)
	if errors.As(err, &netlink.LinkNotFoundError{}) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("pod bridge %s: %w", dp.b.cfg.PodBridge, err)
	}
	br, ok := l.(*netlink.Bridge)
	switch {
	case !ok:
		return 0, fmt.Errorf("pod bridge %s is a %s device, not a bridge", dp.b.cfg.PodBridge, l.Type())
	case br.VlanFiltering != nil && *br.VlanFiltering:
		return 0, fmt.Errorf("pod bridge %s filters by VLAN, which the fast path's bridge program would skip: not attached", dp.b.cfg.PodBridge)
	}
	return l.Attrs().Index, nil
}

// attachBridge loads the bridge program and attaches it to the egress of
// the bridge of this index, in the calling thread's network namespace,
// unless it is there already. It reports whether it attached it.
func (f *fastPath) attachBridge(index int) (bool, error) {
	if f.bridgeAlive(index) {
		return false, nil
	}
	f.detachBridge()
	prog, err := f.loadProg(fastpathProgWeftFpBridge, f.params)
	if err != nil {
		return false, fmt.Errorf("%w: %w", errLoad, err)
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: index, Program: prog, Attach: ebpf.AttachTCXEgress})
	if err != nil {
		prog.Close()
		return false, fmt.Errorf("attach to the pod bridge's egress: %w", err)
	}
	f.brProg, f.brLink, f.brIndex = prog, l, index
	return true, nil
}

// bridgeAlive reports whether the bridge program is attached to the egress
// of the device of this index.
func (f *fastPath) bridgeAlive(index int) bool {
	if f.brLink == nil || f.brIndex != index {
		return false
	}
	info, err := f.brLink.Info()
	return err == nil && info.TCX() != nil && int(info.TCX().Ifindex) == index
}

// detachBridge removes the bridge program and empties the ports map.
func (f *fastPath) detachBridge() {
	if f.brLink != nil {
		f.brLink.Close()
	}
	if f.brProg != nil {
		f.brProg.Close()
	}
	f.brLink, f.brProg, f.brIndex = nil, nil, 0
	for k := range f.portKeys {
		f.ports.Delete(k)
	}
	clear(f.portKeys)
}

// loadPorts makes the ports map hold the forwarding database of the bridge
// of this index: each MAC it learned or was given on a port, with the
// port's index. The bridge's own addresses (permanent entries, for the
// host) and group addresses are left out.
func (f *fastPath) loadPorts(h *netlink.Handle, bridge int) error {
	ns, err := kernel.ListNeighbours(h, 0, unix.AF_BRIDGE)
	if err != nil {
		return fmt.Errorf("read the pod bridge's forwarding database: %w", err)
	}
	want := map[txKey]uint32{}
	for _, n := range ns {
		if k, port, ok := portEntry(n, bridge); ok {
			want[k] = port
		}
	}
	var errs []error
	for k, port := range want {
		if f.portKeys[k] == port {
			continue
		}
		if err := f.ports.Put(k, port); err != nil {
			errs = append(errs, err)
			f.forgetPort(k) // not left on a port it has left
			continue
		}
		f.portKeys[k] = port
	}
	for k := range f.portKeys {
		if _, ok := want[k]; !ok {
			f.forgetPort(k)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("ports map: some entries not written (those MACs go through the bridge): %w", errs[0])
	}
	return nil
}

// portUpdate applies a change of the bridge's forwarding database that
// the kernel reported, between syncs: a new or moved entry is written; a
// deleted one, or one that no longer belongs in the map, is removed. A
// failed write leaves the MAC to the bridge.
func (f *fastPath) portUpdate(u netlink.NeighUpdate) {
	if f.brIndex == 0 || u.Family != unix.AF_BRIDGE || u.MasterIndex != f.brIndex || len(u.HardwareAddr) != 6 {
		return
	}
	k, port, ok := portEntry(u.Neigh, f.brIndex)
	if !ok {
		copy(k[:], u.HardwareAddr)
	}
	_, held := f.portKeys[k]
	switch {
	case u.Type == unix.RTM_DELNEIGH:
		if held && f.portKeys[k] == uint32(u.LinkIndex) {
			f.forgetPort(k)
		}
	case u.Type != unix.RTM_NEWNEIGH:
	case !ok:
		if held {
			f.forgetPort(k)
		}
	case f.portKeys[k] != port:
		if err := f.ports.Put(k, port); err != nil {
			f.forgetPort(k)
			return
		}
		f.portKeys[k] = port
	}
}

// forgetPort removes a MAC from the ports map.
func (f *fastPath) forgetPort(k txKey) {
	if err := f.ports.Delete(k); err == nil || errors.Is(err, ebpf.ErrKeyNotExist) {
		delete(f.portKeys, k)
	}
}

// portEntry returns the ports map's key and value for a forwarding
// database entry of the bridge of this index on one of its ports, if it
// belongs in the map.
func portEntry(n netlink.Neigh, bridge int) (txKey, uint32, bool) {
	var k txKey
	mac := net.HardwareAddr(n.HardwareAddr)
	switch {
	case n.Family != unix.AF_BRIDGE, n.MasterIndex != bridge, n.LinkIndex == bridge, n.LinkIndex <= 0,
		len(mac) != 6, mac[0]&1 != 0, n.State&netlink.NUD_PERMANENT != 0:
		return k, 0, false
	}
	copy(k[:], mac)
	return k, uint32(n.LinkIndex), true
}
