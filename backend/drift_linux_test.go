package backend

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
	vt := vtep.VTEP{Addr: netip.MustParseAddr("192.168.1.7"), MAC: subnet.MAC{0x4e, 1, 2, 3, 4, 5}}
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
	} {
		if got := d.Route(c.u); got != c.want {
			t.Errorf("%s: drift %v, want %v", c.name, got, c.want)
		}
	}
}
