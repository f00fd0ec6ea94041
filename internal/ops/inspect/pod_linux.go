package inspect

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// ReadPodLink reads how the pod behind pod (a handle in the pod's
// namespace) holding ip is wired into the node behind node.
func ReadPodLink(pod, node *netlink.Handle, ip netip.Addr) (PodLink, error) {
	links, err := retry(func() ([]netlink.Link, error) { return pod.LinkList() })
	if err != nil {
		return PodLink{}, fmt.Errorf("pod links: %w", err)
	}
	for _, l := range links {
		addrs, err := pod.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return PodLink{}, fmt.Errorf("addresses of %s: %w", l.Attrs().Name, err)
		}
		for _, a := range addrs {
			pa, ok := netip.AddrFromSlice(a.IP)
			if !ok || pa.Unmap() != ip {
				continue
			}
			ones, _ := a.Mask.Size()
			pl := PodLink{Iface: l.Attrs().Name, Addr: netip.PrefixFrom(ip, ones)}
			pl.Gateway = defaultGateway(pod, ip)
			return pl, hostEnd(node, l, &pl)
		}
	}
	return PodLink{}, fmt.Errorf("no interface in the pod holds %s", ip)
}

// hostEnd fills the node's end of the pod's veth and its bridge.
func hostEnd(node *netlink.Handle, l netlink.Link, pl *PodLink) error {
	if _, ok := l.(*netlink.Veth); !ok {
		return fmt.Errorf("pod interface %s is a %s, not a veth", pl.Iface, l.Type())
	}
	peer := l.Attrs().ParentIndex // IFLA_LINK: the peer's index in its namespace
	if peer == 0 {
		return fmt.Errorf("pod interface %s: the kernel names no peer", pl.Iface)
	}
	host, err := node.LinkByIndex(peer)
	if err != nil {
		return fmt.Errorf("node end of %s (index %d): %w", pl.Iface, peer, err)
	}
	pl.HostVeth = host.Attrs().Name
	if m := host.Attrs().MasterIndex; m > 0 {
		br, err := node.LinkByIndex(m)
		if err != nil {
			return fmt.Errorf("bridge of %s: %w", pl.HostVeth, err)
		}
		pl.Bridge = br.Attrs().Name
	}
	return nil
}

func defaultGateway(h *netlink.Handle, src netip.Addr) netip.Addr {
	family := netlink.FAMILY_V4
	if src.Is6() {
		family = netlink.FAMILY_V6
	}
	rs, err := h.RouteList(nil, family)
	if err != nil {
		return netip.Addr{}
	}
	for _, r := range rs {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			if gw, ok := netip.AddrFromSlice(r.Gw); ok {
				return gw.Unmap()
			}
		}
	}
	return netip.Addr{}
}
