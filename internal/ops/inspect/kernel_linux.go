package inspect

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/subnet"
)

// dumpRetries bounds retries of a netlink dump the kernel interrupted.
const dumpRetries = 10

// retry runs a netlink dump until it is not interrupted.
func retry[T any](f func() (T, error)) (T, error) {
	var v T
	var err error
	for range dumpRetries {
		if v, err = f(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, err
}

// FindDevice finds the overlay device in h's namespace: the one named name
// if name is not empty, else a VXLAN device named weft.* or a TAP named
// weft-u.* (weft's), else a VXLAN device named flannel.* (flanneld's), else
// the WireGuard device flannel-wg (weft's and flanneld's: a kernel WireGuard
// device, or the TUN that weftd's in-process WireGuard runs on), then
// flannel-wg-v6.
func FindDevice(h *netlink.Handle, name string) (Device, error) {
	links, err := retry(h.LinkList)
	if err != nil {
		return Device{}, fmt.Errorf("find overlay device: %w", err)
	}
	rank := func(l netlink.Link) int {
		n := l.Attrs().Name
		_, vx := l.(*netlink.Vxlan)
		switch {
		case name != "":
			if n == name {
				return 1
			}
		case vx && strings.HasPrefix(n, "weft."):
			return 1
		case strings.HasPrefix(n, "weft-u."):
			return 2
		case vx && strings.HasPrefix(n, "flannel."):
			return 3
		case n == wireGuardDevice:
			return 4
		case n == wireGuardDevice+"-v6":
			return 5
		}
		return 0
	}
	var best netlink.Link
	for _, l := range links {
		if r := rank(l); r > 0 && (best == nil || r < rank(best)) {
			best = l
		}
	}
	if best == nil {
		if name != "" {
			return Device{}, fmt.Errorf("find overlay device: no link named %q in this network namespace", name)
		}
		return Device{}, errors.New("find overlay device: no weft.<VNI>, weft-u.<VNI>, flannel.<VNI> or flannel-wg device in this network namespace: is weftd running here?")
	}
	return describe(h, best, links)
}

func describe(h *netlink.Handle, l netlink.Link, links []netlink.Link) (Device, error) {
	a := l.Attrs()
	d := Device{Name: a.Name, Index: a.Index, Kind: KindTAP, MTU: a.MTU, Up: a.Flags&net.FlagUp != 0}
	copy(d.MAC[:], a.HardwareAddr)
	if t, ok := l.(*netlink.Tuntap); l.Type() == "wireguard" || ok && t.Mode == netlink.TUNTAP_MODE_TUN {
		d.Kind = KindWireGuard
	}
	if v, ok := l.(*netlink.Vxlan); ok {
		d.Kind, d.VNI, d.Port = KindVXLAN, v.VxlanId, v.Port
		d.Local, _ = netip.AddrFromSlice(v.SrcAddr)
		d.Local = d.Local.Unmap()
		if i := slices.IndexFunc(links, func(u netlink.Link) bool { return u.Attrs().Index == v.VtepDevIndex }); i >= 0 {
			d.Underlay = links[i].Attrs().Name
		}
	}
	addrs, err := retry(func() ([]netlink.Addr, error) { return h.AddrList(l, netlink.FAMILY_ALL) })
	if err != nil {
		return Device{}, fmt.Errorf("addresses of %s: %w", a.Name, err)
	}
	for _, ad := range addrs {
		ip, _ := netip.AddrFromSlice(ad.IP)
		ones, _ := ad.Mask.Size()
		d.Addrs = append(d.Addrs, netip.PrefixFrom(ip.Unmap(), ones))
	}
	return d, nil
}

// ReadKernel reads the overlay device (see FindDevice) and its permanent
// neighbours, FDB entries and routes.
func ReadKernel(h *netlink.Handle, device string) (*Kernel, error) {
	d, err := FindDevice(h, device)
	if err != nil {
		return nil, err
	}
	k := &Kernel{Device: d}
	neighs, err := retry(func() ([]netlink.Neigh, error) { return h.NeighList(d.Index, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, fmt.Errorf("neighbours of %s: %w", d.Name, err)
	}
	for _, n := range neighs {
		if n.LinkIndex != d.Index || n.Family == unix.AF_BRIDGE || len(n.HardwareAddr) != 6 || n.IP == nil {
			continue
		}
		ip, _ := netip.AddrFromSlice(n.IP)
		mac := subnet.MAC(n.HardwareAddr)
		k.Neighbours = append(k.Neighbours, Neighbour{IP: ip.Unmap(), MAC: mac, Permanent: n.State&netlink.NUD_PERMANENT != 0})
	}
	if d.Kind == KindVXLAN {
		if k.FDB, err = readFDB(h, d.Index); err != nil {
			return nil, err
		}
	}
	routes, err := retry(func() ([]netlink.Route, error) {
		return h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{LinkIndex: d.Index}, netlink.RT_FILTER_OIF)
	})
	if err != nil {
		return nil, fmt.Errorf("routes of %s: %w", d.Name, err)
	}
	for _, r := range routes {
		if rt, ok := convertRoute(r); ok {
			k.Routes = append(k.Routes, rt)
		}
	}
	sortKernel(k)
	return k, nil
}

func readFDB(h *netlink.Handle, index int) ([]FDBEntry, error) {
	fdb, err := retry(func() ([]netlink.Neigh, error) { return h.NeighList(index, unix.AF_BRIDGE) })
	if err != nil {
		return nil, fmt.Errorf("fdb of link %d: %w", index, err)
	}
	var out []FDBEntry
	for _, n := range fdb {
		if n.LinkIndex != index || len(n.HardwareAddr) != 6 || n.IP == nil {
			continue
		}
		ip, _ := netip.AddrFromSlice(n.IP)
		out = append(out, FDBEntry{MAC: subnet.MAC(n.HardwareAddr), Dst: ip.Unmap()})
	}
	return out, nil
}

func convertRoute(r netlink.Route) (Route, bool) {
	if r.Dst == nil || r.Table != unix.RT_TABLE_MAIN && r.Table != 0 {
		return Route{}, false
	}
	ip, _ := netip.AddrFromSlice(r.Dst.IP)
	ones, _ := r.Dst.Mask.Size()
	rt := Route{Dst: netip.PrefixFrom(ip.Unmap(), ones), OnLink: r.Flags&int(netlink.FLAG_ONLINK) != 0, Proto: int(r.Protocol)}
	if r.Gw != nil {
		gw, _ := netip.AddrFromSlice(r.Gw)
		rt.Gw = gw.Unmap()
	}
	return rt, true
}

func sortKernel(k *Kernel) {
	slices.SortFunc(k.Neighbours, func(a, b Neighbour) int { return a.IP.Compare(b.IP) })
	slices.SortFunc(k.FDB, func(a, b FDBEntry) int { return a.Dst.Compare(b.Dst) })
	slices.SortFunc(k.Routes, func(a, b Route) int {
		if c := a.Dst.Addr().Compare(b.Dst.Addr()); c != 0 {
			return c
		}
		return a.Dst.Bits() - b.Dst.Bits()
	})
}
