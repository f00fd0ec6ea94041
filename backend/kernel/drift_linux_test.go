package kernel

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

func TestOverlayDriftRoutes(t *testing.T) {
	peer := netip.MustParsePrefix("10.244.7.0/24")
	vt := vtep.Peer{Addr: netip.MustParseAddr("192.168.1.7"), MAC: subnet.MAC{0x4e, 1, 2, 3, 4, 5}}
	d := NewOverlayDrift(vtep.Table{peer: vt}, map[string]int{"weft.1": 3})
	cidr := func(s string) *net.IPNet { _, n, _ := net.ParseCIDR(s); return n }
	upd := func(typ uint16, r netlink.Route) netlink.RouteUpdate { return netlink.RouteUpdate{Type: typ, Route: r} }
	unicast := func(dst, gw string, proto netlink.RouteProtocol, table int) netlink.Route {
		r := netlink.Route{LinkIndex: 3, Dst: cidr(dst), Protocol: proto, Table: table, Type: unix.RTN_UNICAST}
		if gw != "" {
			r.Gw = net.ParseIP(gw)
		}
		return r
	}
	for _, c := range []struct {
		name string
		u    netlink.RouteUpdate
		want bool
	}{
		{"our route programmed", upd(unix.RTM_NEWROUTE, unicast("10.244.7.0/24", "10.244.7.0", RouteProtocol, unix.RT_TABLE_MAIN)), false},
		{"our route deleted", upd(unix.RTM_DELROUTE, unicast("10.244.7.0/24", "10.244.7.0", RouteProtocol, unix.RT_TABLE_MAIN)), true},
		{"a route we do not want", upd(unix.RTM_NEWROUTE, unicast("10.244.9.0/24", "10.244.9.0", RouteProtocol, unix.RT_TABLE_MAIN)), true},
		{"our route sent elsewhere", upd(unix.RTM_NEWROUTE, unicast("10.244.7.0/24", "10.244.8.0", netlink.RouteProtocol(unix.RTPROT_BOOT), unix.RT_TABLE_MAIN)), true},
		{"an admin's route on the link", upd(unix.RTM_NEWROUTE, unicast("10.99.0.0/16", "10.244.7.0", netlink.RouteProtocol(unix.RTPROT_BOOT), 0)), true},
		{"the kernel's link-local prefix", upd(unix.RTM_NEWROUTE, unicast("fe80::/64", "", unix.RTPROT_KERNEL, unix.RT_TABLE_MAIN)), false},
		{"the kernel's local route of the link-local address", upd(unix.RTM_NEWROUTE, netlink.Route{LinkIndex: 3,
			Dst: cidr("fe80::50b5:2ff:fe60:394f/128"), Protocol: unix.RTPROT_KERNEL, Table: unix.RT_TABLE_LOCAL, Type: unix.RTN_LOCAL}), false},
		{"a multicast route", upd(unix.RTM_NEWROUTE, netlink.Route{LinkIndex: 3, Dst: cidr("ff00::/8"),
			Protocol: netlink.RouteProtocol(unix.RTPROT_BOOT), Table: unix.RT_TABLE_LOCAL, Type: unix.RTN_MULTICAST}), false},
		{"a route in another table", upd(unix.RTM_NEWROUTE, unicast("10.244.9.0/24", "10.244.9.0", RouteProtocol, 100)), false},
		{"a route on another link", upd(unix.RTM_NEWROUTE, netlink.Route{LinkIndex: 2, Dst: cidr("10.9.0.0/16"),
			Protocol: netlink.RouteProtocol(unix.RTPROT_BOOT), Table: unix.RT_TABLE_MAIN, Type: unix.RTN_UNICAST}), false},
		{"another owner's route to a wanted subnet on another link (it may replace ours)", upd(unix.RTM_NEWROUTE, netlink.Route{LinkIndex: 2,
			Dst: cidr("10.244.7.0/24"), Gw: net.ParseIP("192.168.1.9"), Protocol: netlink.RouteProtocol(unix.RTPROT_BOOT),
			Table: unix.RT_TABLE_MAIN, Type: unix.RTN_UNICAST}), true},
		{"another owner's route to a wanted subnet deleted", upd(unix.RTM_DELROUTE, netlink.Route{LinkIndex: 2,
			Dst: cidr("10.244.7.0/24"), Gw: net.ParseIP("192.168.1.9"), Protocol: netlink.RouteProtocol(unix.RTPROT_BOOT),
			Table: unix.RT_TABLE_MAIN, Type: unix.RTN_UNICAST}), false},
	} {
		if got := d.Route(c.u); got != c.want {
			t.Errorf("%s: drift %v, want %v", c.name, got, c.want)
		}
	}
}

func TestOverlayDriftNeighs(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("10.244.7.0/24"), netip.MustParsePrefix("fd00:7::/64")
	mac4, mac6 := subnet.MAC{0x4e, 1, 2, 3, 4, 5}, subnet.MAC{0x4e, 1, 2, 3, 4, 6}
	d := NewOverlayDrift(vtep.Table{
		v4: {Addr: netip.MustParseAddr("192.168.1.7"), MAC: mac4},
		v6: {Addr: netip.MustParseAddr("fd99::7"), MAC: mac6},
	}, map[string]int{"weft.1": 3})
	upd := func(typ uint16, link, family int, ip string, mac subnet.MAC, state int) netlink.NeighUpdate {
		return netlink.NeighUpdate{Type: typ, Neigh: netlink.Neigh{LinkIndex: link, Family: family,
			IP: net.ParseIP(ip), HardwareAddr: net.HardwareAddr(mac[:]), State: state}}
	}
	other := subnet.MAC{0x4e, 9, 9, 9, 9, 9}
	for _, c := range []struct {
		name string
		u    netlink.NeighUpdate
		want bool
	}{
		{"our IPv4 neighbour programmed", upd(unix.RTM_NEWNEIGH, 3, unix.AF_INET, "10.244.7.0", mac4, netlink.NUD_PERMANENT), false},
		{"our IPv6 neighbour programmed", upd(unix.RTM_NEWNEIGH, 3, unix.AF_INET6, "fd00:7::", mac6, netlink.NUD_PERMANENT), false},
		{"our IPv4 neighbour deleted", upd(unix.RTM_DELNEIGH, 3, unix.AF_INET, "10.244.7.0", mac4, netlink.NUD_PERMANENT), true},
		{"our IPv6 neighbour deleted", upd(unix.RTM_DELNEIGH, 3, unix.AF_INET6, "fd00:7::", mac6, netlink.NUD_PERMANENT), true},
		{"our neighbour with another MAC", upd(unix.RTM_NEWNEIGH, 3, unix.AF_INET, "10.244.7.0", other, netlink.NUD_PERMANENT), true},
		{"our neighbour no longer permanent", upd(unix.RTM_NEWNEIGH, 3, unix.AF_INET, "10.244.7.0", mac4, netlink.NUD_REACHABLE), true},
		{"a permanent neighbour we do not want", upd(unix.RTM_NEWNEIGH, 3, unix.AF_INET, "10.244.8.0", other, netlink.NUD_PERMANENT), true},
		{"an address inside a peer's subnet, not its gateway", upd(unix.RTM_NEWNEIGH, 3, unix.AF_INET, "10.244.7.5", mac4, netlink.NUD_PERMANENT), true},
		{"a learned neighbour", upd(unix.RTM_NEWNEIGH, 3, unix.AF_INET, "10.244.8.0", other, netlink.NUD_REACHABLE), false},
		{"another link's neighbour deleted", upd(unix.RTM_DELNEIGH, 2, unix.AF_INET, "10.244.7.0", mac4, netlink.NUD_PERMANENT), false},
		{"an FDB entry", upd(unix.RTM_DELNEIGH, 3, unix.AF_BRIDGE, "192.168.1.7", mac4, netlink.NUD_PERMANENT), false},
	} {
		if got := d.Neigh(c.u); got != c.want {
			t.Errorf("%s: drift %v, want %v", c.name, got, c.want)
		}
	}
}
