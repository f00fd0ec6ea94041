package nettest

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/vtep"
)

// KernelPeer is a peer of a KernelVXLAN node: its underlay address and pod
// subnet.
type KernelPeer struct {
	Addr   netip.Addr
	Subnet netip.Prefix
}

// KernelVXLAN makes on ns the VXLAN node Flannel makes with the kernel's
// driver, by hand: device vx0 on eth0 (VNI 1, port 8472, nolearning, MTU
// mtu, MAC vtep.DeviceMAC(local, 1), subnet's first address), and for each
// peer the neighbour, FDB entry and onlink route Flannel programs.
func KernelVXLAN(ns *NS, local netip.Addr, subnet netip.Prefix, mtu int, peers ...KernelPeer) error {
	for _, c := range [][]string{
		{"ip", "link", "add", "vx0", "address", vtep.DeviceMAC(local, 1).String(), "mtu", fmt.Sprint(mtu), "type", "vxlan",
			"id", "1", "dstport", "8472", "local", local.String(), "dev", "eth0", "nolearning"},
		{"ip", "addr", "add", subnet.Addr().String() + "/32", "dev", "vx0"},
		{"ip", "link", "set", "vx0", "up"},
	} {
		if _, err := ns.Run(c...); err != nil {
			return err
		}
	}
	l, err := ns.Handle.LinkByName("vx0")
	if err != nil {
		return err
	}
	for _, p := range peers {
		mac, gw := vtep.DeviceMAC(p.Addr, 1), p.Subnet.Addr().String()
		if _, err := ns.Run("ip", "neigh", "replace", gw, "lladdr", mac.String(), "dev", "vx0", "nud", "permanent"); err != nil {
			return err
		}
		// With netlink: the `bridge` on PATH may be the CNI plugin of that name.
		fdb := &netlink.Neigh{LinkIndex: l.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
			Flags: netlink.NTF_SELF, IP: p.Addr.AsSlice(), HardwareAddr: mac.HardwareAddr()}
		if err := ns.Handle.NeighSet(fdb); err != nil {
			return fmt.Errorf("add fdb: %w", err)
		}
		if _, err := ns.Run("ip", "route", "replace", p.Subnet.String(), "via", gw, "dev", "vx0", "onlink"); err != nil {
			return err
		}
	}
	return nil
}
