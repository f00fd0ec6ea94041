package kernel

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// orderCheck is a PeerStep that checks in the kernel, when Ensure is called,
// that each peer's neighbour is already there and its route not yet.
type orderCheck struct {
	t       *testing.T
	ns      *nettest.NS
	ensured []string
	pruned  int
}

func (o *orderCheck) Ensure(peers []vtep.Entry) (int, error) {
	neigh := nettest.MustRun(o.t, o.ns, "ip", "neigh", "show", "dev", "tap0")
	for _, p := range peers {
		if !strings.Contains(neigh, Gateway(p.Subnet).String()+" ") {
			o.t.Errorf("step ran before the neighbour of %s:\n%s", p.Subnet, neigh)
		}
		if r := nettest.MustRun(o.t, o.ns, "ip", "route", "show", p.Subnet.String()); r != "" {
			o.t.Errorf("step ran after the route of %s: %s", p.Subnet, r)
		}
		o.ensured = append(o.ensured, p.Subnet.String())
	}
	return 0, nil
}

func (o *orderCheck) Prune(peers []vtep.Entry) (int, error) {
	o.pruned++
	return 0, nil
}

// TestOverlayOnTAP programs a TAP link, as backend/uvxlan does, with both
// families on one link, and checks the kernel state, the step order, an
// adoption with nothing to do, and removal.
func TestOverlayOnTAP(t *testing.T) {
	ns := nettest.NewNS(t, "ovl")
	nettest.MustRun(t, ns, "ip", "tuntap", "add", "dev", "tap0", "mode", "tap")
	nettest.MustRun(t, ns, "ip", "link", "set", "tap0", "up")
	l, err := ns.Handle.LinkByName("tap0")
	if err != nil {
		t.Fatal(err)
	}
	step := &orderCheck{t: t, ns: ns}
	o := NewOverlay(ns.Handle, l.Attrs().Index, OverlayOptions{Family: netlink.FAMILY_ALL, Step: step})
	m, _ := subnet.ParseMAC("0a:00:00:00:00:02")
	table := vtep.Table{
		netip.MustParsePrefix("10.244.2.0/24"):      {MAC: m, Addr: netip.MustParseAddr("192.168.77.2")},
		netip.MustParsePrefix("fd00:10:244:2::/64"): {MAC: m, Addr: netip.MustParseAddr("fd77::2")},
	}
	st, err := o.Sync(table)
	if err != nil {
		t.Fatal(err)
	}
	if st.NeighSet != 2 || st.RouteSet != 2 || st.NeighDel+st.RouteDel != 0 {
		t.Errorf("first sync stats %+v", st)
	}
	if step.pruned != 1 {
		t.Errorf("step pruned %d times, want 1", step.pruned)
	}
	if want := []string{"10.244.2.0/24", "fd00:10:244:2::/64"}; !slices.Equal(step.ensured, want) {
		t.Errorf("step saw %v, want %v", step.ensured, want)
	}
	show := func(argv ...string) string {
		return strings.Join(strings.Fields(nettest.MustRun(t, ns, argv...)), " ")
	}
	for _, c := range []struct{ argv, want string }{
		{"ip -4 neigh show dev tap0 nud permanent", "10.244.2.0 lladdr 0a:00:00:00:00:02 PERMANENT"},
		{"ip -6 neigh show dev tap0 nud permanent", "fd00:10:244:2:: lladdr 0a:00:00:00:00:02 PERMANENT"},
		{"ip -4 route show dev tap0", "10.244.2.0/24 via 10.244.2.0 proto 87 onlink linkdown"},
		{"ip -6 route show dev tap0 proto 87", "fd00:10:244:2::/64 via fd00:10:244:2:: metric 1024 onlink linkdown pref medium"},
	} {
		if got := show(strings.Fields(c.argv)...); got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.argv, got, c.want)
		}
	}
	p, err := o.Programmed()
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Neighbours) != 2 || len(p.Routes) != 2 {
		t.Errorf("Programmed() = %+v", p)
	}

	// A second overlay on the same link (a restarted daemon) adopts it all.
	o2 := NewOverlay(ns.Handle, l.Attrs().Index, OverlayOptions{Family: netlink.FAMILY_ALL})
	if st, err := o2.Sync(table); err != nil || st.Changed() {
		t.Errorf("adopting sync: %+v, %v", st, err)
	}
	// A family-restricted overlay leaves the other family alone.
	o4 := NewOverlay(ns.Handle, l.Attrs().Index, OverlayOptions{Family: netlink.FAMILY_V4})
	if st, err := o4.Sync(vtep.Table{}); err != nil || st.RouteDel != 1 || st.NeighDel != 1 {
		t.Errorf("IPv4-only removal: %+v, %v", st, err)
	}
	if got := show("ip", "-6", "route", "show", "dev", "tap0", "proto", "87"); got == "" {
		t.Error("IPv4 overlay removed the IPv6 route")
	}
	if st, err := o.Sync(vtep.Table{}); err != nil || st.RouteDel != 1 || st.NeighDel != 1 {
		t.Errorf("removal: %+v, %v", st, err)
	}
	if got := show("ip", "neigh", "show", "dev", "tap0", "nud", "permanent"); got != "" {
		t.Errorf("neighbours left: %q", got)
	}
}

// TestUpgradeFromPerSubnetMetric: routes an earlier weft programmed with a
// metric of their own per subnet (the low 16 bits of the subnet's number)
// are replaced by routes with the default metric, one sync removes every
// old one, also where the new route is already in place beside it, and
// none is left beside its replacement.
func TestUpgradeFromPerSubnetMetric(t *testing.T) {
	ns := nettest.NewNS(t, "upg")
	nettest.MustRun(t, ns, "ip", "tuntap", "add", "dev", "tap0", "mode", "tap")
	nettest.MustRun(t, ns, "ip", "link", "set", "tap0", "up")
	l, err := ns.Handle.LinkByName("tap0")
	if err != nil {
		t.Fatal(err)
	}
	idx := l.Attrs().Index
	const peers = 6
	table := vtep.Table{}
	var want []string
	for i := 1; i <= peers; i++ {
		sn := fmt.Sprintf("10.244.%d.0/24", i)
		gw := fmt.Sprintf("10.244.%d.0", i)
		mac := fmt.Sprintf("0a:00:00:00:00:%02x", i)
		m, _ := subnet.ParseMAC(mac)
		table[netip.MustParsePrefix(sn)] = vtep.Peer{MAC: m, Addr: netip.MustParseAddr(fmt.Sprintf("192.168.77.%d", i))}
		nettest.MustRun(t, ns, "ip", "neigh", "add", gw, "lladdr", mac, "dev", "tap0", "nud", "permanent")
		// As the earlier release wrote it: metric 0xf4<i>.
		nettest.MustRun(t, ns, "ip", "route", "add", sn, "via", gw, "dev", "tap0", "onlink", "proto", "87", "metric", fmt.Sprint(0xf400|i))
		if i == 1 { // a node part-way through: the new route already beside the old one
			nettest.MustRun(t, ns, "ip", "route", "add", sn, "via", gw, "dev", "tap0", "onlink", "proto", "87")
		}
		want = append(want, sn+" via "+gw+" proto 87 onlink linkdown")
	}
	opts := OverlayOptions{Family: netlink.FAMILY_V4}
	o := NewOverlay(ns.Handle, idx, opts)
	st, err := o.Sync(table)
	if err != nil {
		t.Fatal(err)
	}
	if st.RouteSet != peers-1 || st.RouteDel != peers || st.NeighSet+st.NeighDel != 0 {
		t.Errorf("upgrade sync: %+v, want %d routes set, %d deleted, no neighbour touched", st, peers-1, peers)
	}
	got := strings.Split(strings.TrimSpace(nettest.MustRun(t, ns, "ip", "-4", "route", "show", "dev", "tap0")), "\n")
	for i := range got {
		got[i] = strings.Join(strings.Fields(got[i]), " ")
	}
	if !slices.Equal(got, want) {
		t.Errorf("routes after the upgrade sync:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if st, err := o.Sync(table); err != nil || st.Changed() {
		t.Errorf("second sync: %+v, %v; want nothing to do", st, err)
	}
}

// TestForeignRoutesSurvive: another owner's route to a subnet weft also
// routes (a static route via the same gateway, at another metric) survives
// weft's deletions. A direct route whose peer moved to another address is
// replaced in place (same destination and metric), and the route read
// before is then deleted: by its gateway, link and protocol, which no
// longer match anything, rather than by destination and gateway alone,
// which the kernel would take for the other owner's route. The same for a
// peer that leaves the table.
func TestForeignRoutesSurvive(t *testing.T) {
	ns := nettest.NewNS(t, "foreign")
	for _, c := range [][]string{
		{"ip", "tuntap", "add", "dev", "tap0", "mode", "tap"},
		{"ip", "link", "set", "tap0", "up"},
		{"ip", "link", "add", "ve0", "type", "veth", "peer", "name", "ve1"},
		{"ip", "link", "set", "ve0", "up"},
		{"ip", "link", "set", "ve1", "up"},
		{"ip", "addr", "add", "192.168.77.1/24", "dev", "ve0"},
	} {
		nettest.MustRun(t, ns, c...)
	}
	l, err := ns.Handle.LinkByName("tap0")
	if err != nil {
		t.Fatal(err)
	}
	idx := l.Attrs().Index
	opts := OverlayOptions{Family: netlink.FAMILY_V4, DirectRouting: true}
	peers := func(last byte) vtep.Table {
		tb := vtep.Table{}
		for i := 2; i < 10; i++ {
			tb[netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", i))] = vtep.Peer{Addr: netip.AddrFrom4([4]byte{192, 168, 77, last + byte(i)})}
		}
		return tb
	}
	o := NewOverlay(ns.Handle, idx, opts)
	if _, err := o.Sync(peers(0)); err != nil {
		t.Fatal(err)
	}
	for i := 2; i < 10; i++ {
		nettest.MustRun(t, ns, "ip", "route", "add", fmt.Sprintf("10.244.%d.0/24", i), "via", fmt.Sprintf("192.168.77.%d", i),
			"dev", "ve0", "proto", "static", "metric", "50")
	}
	foreign := func(step string) {
		t.Helper()
		got := nettest.MustRun(t, ns, "ip", "-4", "route", "show", "proto", "static")
		if n := strings.Count(got, "metric 50"); n != 8 {
			t.Errorf("%s: %d of 8 static routes left:\n%s", step, n, got)
		}
	}
	if _, err := o.Sync(peers(20)); err != nil { // every peer at another address
		t.Fatal(err)
	}
	foreign("after the peers moved")
	if got := nettest.MustRun(t, ns, "ip", "-4", "route", "show", "proto", "87"); strings.Count(got, "via 192.168.77.2") != 8 {
		t.Errorf("weft's routes after the peers moved:\n%s", got)
	}
	if _, err := o.Sync(vtep.Table{}); err != nil {
		t.Fatal(err)
	}
	foreign("after the peers left")
	if got := nettest.MustRun(t, ns, "ip", "-4", "route", "show", "proto", "87"); got != "" {
		t.Errorf("weft's routes after the peers left:\n%s", got)
	}
}

// messyNS is a namespace whose overlay link (a VXLAN device, vx0) and
// second link (ve0) hold entries of every kind an overlay's reads must keep
// or skip: permanent and other neighbours, on the link and elsewhere; weft's
// routes on the link and direct ones, the kernel's, other protocols',
// another table's, a blackhole, a multipath and a default route; both
// families.
func messyNS(t *testing.T) (*nettest.NS, int) {
	ns := nettest.NewNS(t, "messy")
	for _, cmd := range [][]string{
		{"ip", "link", "add", "vx0", "address", "0a:00:00:00:00:01", "type", "vxlan", "id", "1", "dstport", "8472", "nolearning"},
		{"ip", "link", "add", "ve0", "type", "veth", "peer", "name", "ve1"},
		{"ip", "link", "set", "vx0", "up"},
		{"ip", "link", "set", "ve0", "up"},
		{"ip", "link", "set", "ve1", "up"},
		{"ip", "addr", "add", "192.168.5.1/24", "dev", "ve0"},
		{"ip", "addr", "add", "fd05::1/64", "dev", "ve0", "nodad"},
		{"ip", "neigh", "add", "10.1.0.0", "lladdr", "0a:00:00:00:01:00", "dev", "vx0", "nud", "permanent"},
		{"ip", "neigh", "add", "10.1.1.0", "lladdr", "0a:00:00:00:01:01", "dev", "vx0", "nud", "reachable"},
		{"ip", "neigh", "add", "fd00:1::", "lladdr", "0a:00:00:00:01:02", "dev", "vx0", "nud", "permanent"},
		{"ip", "neigh", "add", "192.168.5.9", "lladdr", "0a:00:00:00:05:09", "dev", "ve0", "nud", "permanent"},
		{"ip", "route", "add", "10.1.0.0/24", "via", "10.1.0.0", "dev", "vx0", "onlink", "proto", "87", "metric", "5"},
		{"ip", "route", "add", "10.1.3.0/24", "via", "10.1.3.0", "dev", "vx0", "onlink"},
		{"ip", "route", "add", "10.1.4.0/24", "dev", "vx0", "scope", "link"},
		{"ip", "route", "add", "default", "via", "10.1.0.0", "dev", "vx0", "onlink"},
		{"ip", "route", "add", "10.9.0.0/24", "via", "192.168.5.2", "proto", "87"},
		{"ip", "route", "add", "10.8.0.0/24", "via", "192.168.5.3"},
		{"ip", "route", "add", "blackhole", "10.7.0.0/24", "proto", "87"},
		{"ip", "route", "add", "10.6.0.0/24", "proto", "87", "nexthop", "via", "192.168.5.4", "nexthop", "via", "192.168.5.5"},
		{"ip", "route", "add", "10.5.0.0/24", "via", "10.5.0.0", "dev", "vx0", "onlink", "proto", "87", "table", "100"},
		{"ip", "-6", "route", "add", "fd00:1::/64", "via", "fd00:1::", "dev", "vx0", "onlink", "proto", "87"},
		{"ip", "-6", "route", "add", "fd00:9::/64", "via", "fd05::2", "proto", "87", "metric", "7"},
		{"ip", "-6", "route", "add", "fd00:8::/64", "via", "fd05::3"},
	} {
		nettest.MustRun(t, ns, cmd...)
	}
	l, err := ns.Handle.LinkByName("vx0")
	if err != nil {
		t.Fatal(err)
	}
	return ns, l.Attrs().Index
}

// TestProgrammed: on a namespace with entries of every kind, Programmed
// reads the permanent neighbours on the overlay link and weft's unicast
// routes of the main table (on the link, or with RouteProtocol anywhere),
// of its family; with DirectOnly only the routes with RouteProtocol.
func TestProgrammed(t *testing.T) {
	ns, idx := messyNS(t)
	names := map[int]string{0: "-", idx: "vx0"}
	if l, err := ns.Handle.LinkByName("ve0"); err == nil {
		names[l.Attrs().Index] = "ve0"
	}
	const (
		n4 = "neigh 10.1.0.0 0a:00:00:00:01:00"
		n6 = "neigh fd00:1:: 0a:00:00:00:01:02"
	)
	v4 := []string{
		"route 0.0.0.0/0 via 10.1.0.0 dev vx0 onlink metric 0",
		"route 10.1.0.0/24 via 10.1.0.0 dev vx0 onlink metric 5",
		"route 10.1.3.0/24 via 10.1.3.0 dev vx0 onlink metric 0",
		"route 10.1.4.0/24 via invalid IP dev vx0 metric 0",
		"route 10.6.0.0/24 via invalid IP dev - metric 0", // multipath
		"route 10.9.0.0/24 via 192.168.5.2 dev ve0 metric 0",
	}
	v6 := []string{
		"route fd00:1::/64 via fd00:1:: dev vx0 onlink metric 1024",
		"route fd00:9::/64 via fd05::2 dev ve0 metric 7",
	}
	for _, tc := range []struct {
		name string
		opts OverlayOptions
		want []string
	}{
		{"both families", OverlayOptions{Family: netlink.FAMILY_ALL}, slices.Concat([]string{n4, n6}, v4, v6)},
		{"IPv4", OverlayOptions{Family: netlink.FAMILY_V4}, slices.Concat([]string{n4}, v4)},
		{"IPv6", OverlayOptions{Family: netlink.FAMILY_V6}, slices.Concat([]string{n6}, v6)},
		{"direct only", OverlayOptions{Family: netlink.FAMILY_ALL, DirectRouting: true, DirectOnly: true}, []string{
			"route 10.1.0.0/24 via 10.1.0.0 dev vx0 onlink metric 5",
			"route 10.6.0.0/24 via invalid IP dev - metric 0",
			"route 10.9.0.0/24 via 192.168.5.2 dev ve0 metric 0",
			"route fd00:1::/64 via fd00:1:: dev vx0 onlink metric 1024",
			"route fd00:9::/64 via fd05::2 dev ve0 metric 7",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewOverlay(ns.Handle, idx, tc.opts).Programmed()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, n := range p.Neighbours {
				got = append(got, fmt.Sprintf("neigh %s %s", n.IP, n.MAC))
			}
			for _, r := range p.Routes {
				onlink := ""
				if r.OnLink {
					onlink = " onlink"
				}
				got = append(got, fmt.Sprintf("route %s via %s dev %s%s metric %d", r.Dst, r.Gw, names[r.LinkIndex], onlink, r.Priority))
			}
			slices.Sort(got)
			want := slices.Sorted(slices.Values(tc.want))
			if !slices.Equal(got, want) {
				t.Errorf("Programmed():\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}
