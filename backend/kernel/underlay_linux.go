package kernel

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Underlay is the device that carries encapsulated traffic, and this node's
// addresses on it.
type Underlay struct {
	Index int
	Name  string
	MTU   int
	IPv4  netip.Addr // first global unicast IPv4 on the device; invalid if none
	IPv6  netip.Addr // first global unicast IPv6 on the device; invalid if none
}

// UnderlayQuery says how to pick the underlay device, in flanneld's order:
// each of Ifaces (a device name or one of its addresses) in turn, then each
// of Regexes (matched against device names and addresses), then the device
// and source address the kernel would use to reach CanReach; with none of
// them set, the default route's device. The first match wins.
type UnderlayQuery struct {
	Ifaces   []string
	Regexes  []string
	CanReach netip.Addr
}

// FindUnderlay picks the underlay device in the namespace of h.
func FindUnderlay(h *netlink.Handle, q UnderlayQuery) (Underlay, error) {
	if len(q.Ifaces) == 0 && len(q.Regexes) == 0 && !q.CanReach.IsValid() {
		return defaultRouteUnderlay(h)
	}
	links, err := h.LinkList()
	if err != nil {
		return Underlay{}, fmt.Errorf("find underlay: list links: %w", err)
	}
	for _, name := range q.Ifaces {
		for _, l := range links {
			if u, ok := underlayMatch(h, l, func(s string) bool { return s == name }); ok {
				return u, nil
			}
		}
	}
	for _, expr := range q.Regexes {
		re, err := regexp.Compile(expr)
		if err != nil {
			return Underlay{}, fmt.Errorf("find underlay: bad --iface-regex %q: %w", expr, err)
		}
		for _, l := range links {
			if u, ok := underlayMatch(h, l, re.MatchString); ok {
				return u, nil
			}
		}
	}
	if q.CanReach.IsValid() {
		return canReachUnderlay(h, q.CanReach)
	}
	return Underlay{}, fmt.Errorf("find underlay: no device named or addressed %q, and none whose name or address matches %q",
		q.Ifaces, q.Regexes)
}

// canReachUnderlay is the device, and the source address, of the kernel's
// route to addr (`ip route get <addr>`).
func canReachUnderlay(h *netlink.Handle, addr netip.Addr) (Underlay, error) {
	rs, err := h.RouteGet(addr.AsSlice())
	if err != nil || len(rs) == 0 || rs[0].LinkIndex == 0 {
		return Underlay{}, fmt.Errorf("find underlay: no route to --iface-can-reach %s: %v", addr, err)
	}
	l, err := h.LinkByIndex(rs[0].LinkIndex)
	if err != nil {
		return Underlay{}, fmt.Errorf("find underlay: device of the route to %s: %w", addr, err)
	}
	u, err := underlayOf(h, l)
	if err != nil {
		return Underlay{}, err
	}
	if src, ok := netip.AddrFromSlice(rs[0].Src); ok && src.Unmap().IsGlobalUnicast() {
		if src = src.Unmap(); src.Is4() {
			u.IPv4 = src
		} else {
			u.IPv6 = src
		}
	}
	return u, nil
}

func defaultRouteUnderlay(h *netlink.Handle) (Underlay, error) {
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := ListRoutes(h, family, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return Underlay{}, fmt.Errorf("find underlay: %w", err)
		}
		for _, r := range routes {
			if r.Dst != nil && !isDefault(r) || r.LinkIndex == 0 {
				continue
			}
			l, err := h.LinkByIndex(r.LinkIndex)
			if err != nil {
				return Underlay{}, fmt.Errorf("find underlay: default route device: %w", err)
			}
			return underlayOf(h, l)
		}
	}
	return Underlay{}, errors.New("find underlay: no default route: name the device with --iface")
}

func isDefault(r netlink.Route) bool {
	ones, _ := r.Dst.Mask.Size()
	return ones == 0
}

// underlayMatch reports whether the link's name or one of its addresses
// satisfies match.
func underlayMatch(h *netlink.Handle, l netlink.Link, match func(string) bool) (Underlay, bool) {
	u, err := underlayOf(h, l)
	if err != nil {
		return Underlay{}, false
	}
	if match(u.Name) {
		return u, true
	}
	addrs, _ := h.AddrList(l, netlink.FAMILY_ALL)
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && match(ip.Unmap().String()) {
			if ip.Unmap().Is4() {
				u.IPv4 = ip.Unmap()
			} else {
				u.IPv6 = ip
			}
			return u, true
		}
	}
	return Underlay{}, false
}

func underlayOf(h *netlink.Handle, l netlink.Link) (Underlay, error) {
	attrs := l.Attrs()
	u := Underlay{Index: attrs.Index, Name: attrs.Name, MTU: attrs.MTU}
	addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return Underlay{}, fmt.Errorf("find underlay: addresses of %s: %w", attrs.Name, err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || !ip.IsGlobalUnicast() {
			continue
		}
		ip = ip.Unmap()
		if ip.Is4() && !u.IPv4.IsValid() {
			u.IPv4 = ip
		} else if ip.Is6() && !u.IPv6.IsValid() {
			u.IPv6 = ip
		}
	}
	return u, nil
}
