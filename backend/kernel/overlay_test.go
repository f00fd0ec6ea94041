package kernel

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

func tpeer(sub, mac, addr string, direct bool) Peer {
	m, err := subnet.ParseMAC(mac)
	if err != nil {
		panic(err)
	}
	return Peer{Entry: vtep.Entry{Subnet: netip.MustParsePrefix(sub), Peer: vtep.Peer{MAC: m, Addr: netip.MustParseAddr(addr)}}, Direct: direct}
}

func tneigh(ip, mac string) Neighbour {
	m, _ := subnet.ParseMAC(mac)
	return Neighbour{IP: netip.MustParseAddr(ip), MAC: m}
}

func onlink(dst string) Route {
	p := netip.MustParsePrefix(dst)
	return Route{Dst: p, Gw: p.Addr(), LinkIndex: 7, OnLink: true, Priority: defaultMetric(p)}
}

func direct(dst, gw string) Route {
	return Route{Dst: netip.MustParsePrefix(dst), Gw: netip.MustParseAddr(gw), LinkIndex: 2}
}

// transcript renders a plan as the operations it applies, in order.
func transcript(sp syncPlan) string {
	var b strings.Builder
	for _, r := range sp.DelRoutes {
		fmt.Fprintf(&b, "route del %s via %s\n", r.Dst, r.Gw)
	}
	for _, n := range sp.SetNeighbours {
		fmt.Fprintf(&b, "neigh set %s %s\n", n.IP, n.MAC)
	}
	for _, r := range sp.SetRoutes {
		fmt.Fprintf(&b, "route set %s via %s onlink=%v\n", r.Dst, r.Gw, r.OnLink)
	}
	for _, r := range sp.DelWrongRoutes {
		fmt.Fprintf(&b, "route del %s via %s metric %d\n", r.Dst, r.Gw, r.Priority)
	}
	for _, n := range sp.DelNeighbours {
		fmt.Fprintf(&b, "neigh del %s\n", n.IP)
	}
	return b.String()
}

func TestPlan(t *testing.T) {
	const m1, m2 = "0a:00:00:00:00:01", "0a:00:00:00:00:02"
	cases := []struct {
		name string
		want []Peer
		have Programmed
		ops  string
	}{
		{
			name: "empty",
		},
		{
			name: "add IPv4 and IPv6 peers",
			want: []Peer{tpeer("10.244.1.0/24", m1, "192.168.0.1", false), tpeer("fd00:1::/64", m1, "fd77::1", false)},
			ops: "neigh set 10.244.1.0 0a:00:00:00:00:01\n" +
				"neigh set fd00:1:: 0a:00:00:00:00:01\n" +
				"route set 10.244.1.0/24 via 10.244.1.0 onlink=true\n" +
				"route set fd00:1::/64 via fd00:1:: onlink=true\n",
		},
		{
			name: "all in place: nothing to do",
			want: []Peer{tpeer("10.244.1.0/24", m1, "192.168.0.1", false), tpeer("fd00:1::/64", m1, "fd77::1", false)},
			have: Programmed{
				Neighbours: []Neighbour{tneigh("10.244.1.0", m1), tneigh("fd00:1::", m1)},
				Routes:     []Route{onlink("10.244.1.0/24"), onlink("fd00:1::/64")},
			},
		},
		{
			name: "remove a peer: route first, neighbour last",
			have: Programmed{Neighbours: []Neighbour{tneigh("10.244.1.0", m1)}, Routes: []Route{onlink("10.244.1.0/24")}},
			ops:  "route del 10.244.1.0/24 via 10.244.1.0\nneigh del 10.244.1.0\n",
		},
		{
			name: "MAC changed: neighbour replaced, route kept",
			want: []Peer{tpeer("10.244.1.0/24", m2, "192.168.0.1", false)},
			have: Programmed{Neighbours: []Neighbour{tneigh("10.244.1.0", m1)}, Routes: []Route{onlink("10.244.1.0/24")}},
			ops:  "neigh set 10.244.1.0 0a:00:00:00:00:02\n",
		},
		{
			name: "route with another metric: right one added, then wrong one deleted",
			want: []Peer{tpeer("10.244.1.0/24", m1, "192.168.0.1", false)},
			have: Programmed{
				Neighbours: []Neighbour{tneigh("10.244.1.0", m1)},
				Routes:     []Route{{Dst: netip.MustParsePrefix("10.244.1.0/24"), Gw: netip.MustParseAddr("10.244.1.0"), LinkIndex: 7, OnLink: true, Priority: 5}},
			},
			ops: "route set 10.244.1.0/24 via 10.244.1.0 onlink=true\nroute del 10.244.1.0/24 via 10.244.1.0 metric 5\n",
		},
		{
			name: "route with a metric of its own (an earlier weft's): replaced by one with the default metric",
			want: []Peer{tpeer("10.244.1.0/24", m1, "192.168.0.1", false)},
			have: Programmed{
				Neighbours: []Neighbour{tneigh("10.244.1.0", m1)},
				Routes:     []Route{{Dst: netip.MustParsePrefix("10.244.1.0/24"), Gw: netip.MustParseAddr("10.244.1.0"), LinkIndex: 7, OnLink: true, Priority: 62465}},
			},
			ops: "route set 10.244.1.0/24 via 10.244.1.0 onlink=true\nroute del 10.244.1.0/24 via 10.244.1.0 metric 62465\n",
		},
		{
			name: "the route with the default metric already beside an earlier weft's: only the old one deleted",
			want: []Peer{tpeer("10.244.1.0/24", m1, "192.168.0.1", false)},
			have: Programmed{
				Neighbours: []Neighbour{tneigh("10.244.1.0", m1)},
				Routes: []Route{
					{Dst: netip.MustParsePrefix("10.244.1.0/24"), Gw: netip.MustParseAddr("10.244.1.0"), LinkIndex: 7, OnLink: true, Priority: 62465},
					onlink("10.244.1.0/24"),
				},
			},
			ops: "route del 10.244.1.0/24 via 10.244.1.0 metric 62465\n",
		},
		{
			name: "direct peer: route via its address, no neighbour",
			want: []Peer{tpeer("10.244.1.0/24", m1, "192.168.0.1", true)},
			ops:  "route set 10.244.1.0/24 via 192.168.0.1 onlink=false\n",
		},
		{
			name: "direct route adopted on any link",
			want: []Peer{tpeer("10.244.1.0/24", m1, "192.168.0.1", true)},
			have: Programmed{Routes: []Route{direct("10.244.1.0/24", "192.168.0.1")}},
		},
		{
			name: "peer turns direct: tunnel route replaced, neighbour dropped",
			want: []Peer{tpeer("10.244.1.0/24", m1, "192.168.0.1", true)},
			have: Programmed{Neighbours: []Neighbour{tneigh("10.244.1.0", m1)}, Routes: []Route{onlink("10.244.1.0/24")}},
			ops: "route set 10.244.1.0/24 via 192.168.0.1 onlink=false\n" +
				"route del 10.244.1.0/24 via 10.244.1.0 metric 0\n" +
				"neigh del 10.244.1.0\n",
		},
		{
			name: "stray route and neighbour on the link removed",
			have: Programmed{
				Neighbours: []Neighbour{tneigh("10.9.0.1", m1)},
				Routes:     []Route{{Dst: netip.MustParsePrefix("10.99.0.0/16"), LinkIndex: 7}},
			},
			ops: "route del 10.99.0.0/16 via invalid IP\nneigh del 10.9.0.1\n",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sp := plan(tc.want, tc.have, 7)
			if got := transcript(sp); got != tc.ops {
				t.Errorf("plan:\n%s\nwant:\n%s", got, tc.ops)
			}
			if sp.empty() != (tc.ops == "") {
				t.Errorf("empty() = %v", sp.empty())
			}
		})
	}
}

func TestGateway(t *testing.T) {
	for in, want := range map[string]string{
		"10.244.7.0/24":      "10.244.7.0",
		"10.244.7.9/24":      "10.244.7.0",
		"fd00:10:244:7::/64": "fd00:10:244:7::",
	} {
		if got := Gateway(netip.MustParsePrefix(in)); got.String() != want {
			t.Errorf("Gateway(%s) = %s, want %s", in, got, want)
		}
	}
}
