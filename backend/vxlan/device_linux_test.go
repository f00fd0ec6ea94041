package vxlan

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/vtep"
)

// peerTable is a table of one dual-stack peer.
func peerTable() vtep.Table {
	return vtep.Table{
		netip.MustParsePrefix("10.244.2.0/24"):      {MAC: mac("0a:00:00:00:00:02"), Addr: netip.MustParseAddr("192.168.77.2")},
		netip.MustParsePrefix("fd00:10:244:2::/64"): {MAC: mac("0a:00:00:00:00:02"), Addr: netip.MustParseAddr("fd77::2")},
	}
}

// TestAdoptOnRestart stops a backend and starts a second one on the same
// namespace, as a restarted weftd does: the device keeps its index and MAC,
// and not one link, neighbour or route is deleted meanwhile.
func TestAdoptOnRestart(t *testing.T) {
	u := nettest.NewUnderlay(t, ul4, 0)
	n1 := newNode(t, u, 1)
	b1 := newBackend(t, n1.config())
	b1.Set(peerTable())
	stop := start(t, b1)
	waitReady(t, b1)
	before4, before6 := state(t, n1.NS, "weft.1"), state(t, n1.NS, "weft-v6.1")
	l1, err := n1.Handle.LinkByName("weft.1")
	if err != nil {
		t.Fatal(err)
	}
	stop()

	deletions := watchDeletions(t, n1.NS)
	b2 := newBackend(t, n1.config())
	b2.Set(peerTable())
	start(t, b2)
	waitReady(t, b2)
	if d := settleDeletions(t, n1.NS, deletions); len(d) > 0 {
		t.Errorf("restart deleted kernel state: %v", d)
	}
	l2, err := n1.Handle.LinkByName("weft.1")
	if err != nil {
		t.Fatal(err)
	}
	if l1.Attrs().Index != l2.Attrs().Index || l1.Attrs().HardwareAddr.String() != l2.Attrs().HardwareAddr.String() {
		t.Errorf("device changed: index %d → %d, mac %s → %s", l1.Attrs().Index, l2.Attrs().Index, l1.Attrs().HardwareAddr, l2.Attrs().HardwareAddr)
	}
	if got := state(t, n1.NS, "weft.1"); !got.equal(before4) {
		t.Errorf("weft.1 state changed:\n%s\nwas:\n%s", got, before4)
	}
	if got := state(t, n1.NS, "weft-v6.1"); !got.equal(before6) {
		t.Errorf("weft-v6.1 state changed:\n%s\nwas:\n%s", got, before6)
	}
}

// settleDeletions returns the deletions recorded so far, including every
// one the kernel announced before this call: it deletes a marker link,
// neighbour and route of its own and waits until their notifications arrive
// (each kind comes in order on its socket), instead of sleeping.
func settleDeletions(t *testing.T, n *nettest.NS, deletions func() []string) []string {
	t.Helper()
	h := n.Handle
	la := netlink.NewLinkAttrs()
	la.Name, la.Flags, la.HardwareAddr = "wmark0", net.FlagUp, net.HardwareAddr{2, 0, 0, 0, 0, 0x0a}
	br := &netlink.Bridge{LinkAttrs: la}
	dst := &net.IPNet{IP: net.IPv4(203, 0, 113, 0).To4(), Mask: net.CIDRMask(24, 32)}
	nb := &netlink.Neigh{IP: net.IPv4(203, 0, 113, 9), HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, 9}, State: netlink.NUD_PERMANENT}
	if err := h.LinkAdd(br); err != nil {
		t.Fatalf("marker link: %v", err)
	}
	br.Index = mustIndex(t, h, "wmark0")
	nb.LinkIndex = br.Index
	rt := &netlink.Route{LinkIndex: br.Index, Dst: dst}
	for _, err := range []error{h.NeighAdd(nb), h.RouteAdd(rt), h.NeighDel(nb), h.RouteDel(rt), h.LinkDel(br)} {
		if err != nil {
			t.Fatalf("marker: %v", err)
		}
	}
	// What the marker link's deletion takes with it: its own routes
	// (IPv6 link-local and multicast) and its bridge FDB entry.
	own := []string{fmt.Sprintf("Ifindex: %d ", br.Index), "neigh <nil> 02:00:00:00:00:0a"}
	var out []string
	seen := map[string]bool{}
	deadline := time.Now().Add(10 * time.Second)
	for !(seen["link"] && seen["neigh"] && seen["route"]) {
		if time.Now().After(deadline) {
			t.Fatalf("marker deletions not announced within 10s (seen %v)", seen)
		}
		for _, d := range deletions() {
			switch {
			case d == "link wmark0":
				seen["link"] = true
			case strings.HasPrefix(d, "neigh 203.0.113.9 "):
				seen["neigh"] = true
			case strings.HasPrefix(d, "route ") && strings.Contains(d, "203.0.113.0/24"):
				seen["route"] = true
			case strings.Contains(d, own[0]) || strings.HasPrefix(d, own[1]):
			default:
				out = append(out, d)
			}
		}
		time.Sleep(5 * time.Millisecond) // poll interval, not synchronisation
	}
	return out
}

func mustIndex(t *testing.T, h *netlink.Handle, name string) int {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Index
}

// watchDeletions records every link, neighbour and route deletion in ns
// until the test ends; the returned function reads the record so far.
func watchDeletions(t *testing.T, n *nettest.NS) func() []string {
	t.Helper()
	nsh, err := netns.GetFromPath(n.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	w := struct {
		links  chan netlink.LinkUpdate
		neighs chan netlink.NeighUpdate
		routes chan netlink.RouteUpdate
		done   chan struct{}
	}{make(chan netlink.LinkUpdate, 64), make(chan netlink.NeighUpdate, 1024), make(chan netlink.RouteUpdate, 1024), make(chan struct{})}
	if err := errors.Join(
		netlink.LinkSubscribeWithOptions(w.links, w.done, netlink.LinkSubscribeOptions{Namespace: &nsh}),
		netlink.NeighSubscribeWithOptions(w.neighs, w.done, netlink.NeighSubscribeOptions{Namespace: &nsh}),
		netlink.RouteSubscribeWithOptions(w.routes, w.done, netlink.RouteSubscribeOptions{Namespace: &nsh}),
	); err != nil {
		close(w.done)
		t.Fatal(err)
	}
	got := make(chan string, 1024)
	go func() {
		for w.links != nil || w.neighs != nil || w.routes != nil {
			select {
			case u, ok := <-w.links:
				if !ok {
					w.links = nil
				} else if u.Header.Type == unix.RTM_DELLINK {
					got <- "link " + u.Link.Attrs().Name
				}
			case u, ok := <-w.neighs:
				if !ok {
					w.neighs = nil
				} else if u.Type == unix.RTM_DELNEIGH && !u.IP.IsMulticast() {
					// Multicast entries (224.0.0.22, ff02::16: the
					// kernel's own IGMP and MLD reports) come and go by
					// themselves; weft never programs one.
					got <- "neigh " + u.IP.String() + " " + u.HardwareAddr.String()
				}
			case u, ok := <-w.routes:
				if !ok {
					w.routes = nil
				} else if u.Type == unix.RTM_DELROUTE {
					got <- "route " + u.Route.String()
				}
			}
		}
		close(got)
	}()
	t.Cleanup(func() {
		close(w.done)
		for range got {
		}
	})
	return func() []string {
		var out []string
		for {
			select {
			case s := <-got:
				out = append(out, s)
			default:
				return out
			}
		}
	}
}

// TestDeviceConflicts: an incompatible device of our name is recreated
// right, and flanneld's flannel.1 (same VNI and port) is removed.
func TestDeviceConflicts(t *testing.T) {
	cases := []struct {
		name    string
		create  func(n *node) netlink.Link
		gone    string // device that must not exist afterwards ("" for none)
		sameMAC bool
	}{
		{
			name: "flannel.1 left by flanneld",
			create: func(n *node) netlink.Link {
				return &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "flannel.1"}, VxlanId: 1, Port: 8472,
					SrcAddr: n.Addr.AsSlice(), VtepDevIndex: n.underlay}
			},
			gone: "flannel.1",
		},
		{
			name: "weft.1 with another port",
			create: func(n *node) netlink.Link {
				return &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "weft.1"}, VxlanId: 1, Port: 4789,
					SrcAddr: n.Addr.AsSlice(), VtepDevIndex: n.underlay}
			},
		},
		{
			name: "weft.1 not a vxlan device",
			create: func(n *node) netlink.Link {
				return &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "weft.1"}}
			},
		},
		{
			name: "weft.1 with a wrong MAC and MTU is fixed in place",
			create: func(n *node) netlink.Link {
				return &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "weft.1", MTU: 1300}, VxlanId: 1, Port: 8472,
					SrcAddr: n.Addr.AsSlice(), VtepDevIndex: n.underlay}
			},
			sameMAC: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := nettest.NewUnderlay(t, ul4, 0)
			n1 := newNode(t, u, 1)
			if err := n1.Handle.LinkAdd(tc.create(n1)); err != nil {
				t.Fatal(err)
			}
			old, _ := n1.Handle.LinkByName("weft.1")
			c := n1.config()
			c.MTU = 1450
			b := newBackend(t, c)
			b.Set(peerTable())
			start(t, b)
			waitReady(t, b)
			l, err := n1.Handle.LinkByName("weft.1")
			if err != nil {
				t.Fatal(err)
			}
			v, ok := l.(*netlink.Vxlan)
			if !ok || v.Port != 8472 || v.VxlanId != 1 || v.MTU != 1450 || v.Learning {
				t.Errorf("weft.1 = %+v", l)
			}
			wantMAC, _ := b.MAC()
			if v.HardwareAddr.String() != wantMAC.String() {
				t.Errorf("weft.1 mac %s, want %s", v.HardwareAddr, wantMAC)
			}
			if tc.sameMAC && (old == nil || old.Attrs().Index != l.Attrs().Index) {
				t.Errorf("compatible device was recreated")
			}
			if tc.gone != "" {
				if _, err := n1.Handle.LinkByName(tc.gone); err == nil {
					t.Errorf("%s still exists", tc.gone)
				}
			}
		})
	}
}

// TestRemoveDevices removes both devices and tolerates their absence.
func TestRemoveDevices(t *testing.T) {
	u := nettest.NewUnderlay(t, ul4, 0)
	n1 := newNode(t, u, 1)
	b := newBackend(t, n1.config())
	b.Set(peerTable())
	stop := start(t, b)
	waitReady(t, b)
	stop()
	for range 2 {
		if err := RemoveDevices(n1.Handle, 1); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"weft.1", "weft-v6.1"} {
		if _, err := n1.Handle.LinkByName(name); err == nil {
			t.Errorf("%s still exists", name)
		}
	}
	if out := nettest.MustRun(t, n1, "ip", "route", "show", "proto", "87"); out != "" {
		t.Errorf("routes left: %s", out)
	}
}

// TestDriftRepair breaks the programmed state the way an admin or another
// agent might, and waits for the backend to put it back.
func TestDriftRepair(t *testing.T) {
	u := nettest.NewUnderlay(t, ul4, 0)
	n1 := newNode(t, u, 1)
	c := n1.config()
	c.ResyncInterval = time.Hour // repairs must come from notifications
	b := newBackend(t, c)
	b.Set(peerTable())
	start(t, b)
	waitReady(t, b)
	want4, want6 := state(t, n1.NS, "weft.1"), state(t, n1.NS, "weft-v6.1")
	wantMAC, _ := b.MAC()

	cases := []struct {
		name  string
		argv  []string
		count func(Repairs) uint64
	}{
		{"route", []string{"ip", "route", "del", "10.244.2.0/24"}, func(r Repairs) uint64 { return r.Route }},
		{"IPv6 route", []string{"ip", "-6", "route", "del", "fd00:10:244:2::/64"}, func(r Repairs) uint64 { return r.Route }},
		{"neighbour", []string{"ip", "neigh", "del", "10.244.2.0", "dev", "weft.1"}, func(r Repairs) uint64 { return r.Neigh }},
		{"neighbour changed", []string{"ip", "neigh", "replace", "10.244.2.0", "lladdr", "0a:00:00:00:00:99", "dev", "weft.1", "nud", "permanent"}, func(r Repairs) uint64 { return r.Neigh }},
		{"neighbour no longer permanent", []string{"ip", "neigh", "replace", "10.244.2.0", "lladdr", "0a:00:00:00:00:02", "dev", "weft.1", "nud", "reachable"}, func(r Repairs) uint64 { return r.Neigh }},
		{"fdb", []string{"/sbin/bridge", "fdb", "del", "0a:00:00:00:00:02", "dev", "weft.1", "dst", "192.168.77.2", "self"}, func(r Repairs) uint64 { return r.FDB }},
		{"fdb no longer permanent", []string{"/sbin/bridge", "fdb", "replace", "0a:00:00:00:00:02", "dev", "weft.1", "dst", "192.168.77.2", "self", "dynamic"}, func(r Repairs) uint64 { return r.FDB }},
		// Another owner's route replaces weft's (same destination and metric)
		// on another device. (IPv6 is left out: while such a route covers the
		// gateway address, the kernel refuses weft's onlink route through
		// another device, EINVAL, and weft does not delete others' routes.)
		{"route replaced elsewhere", []string{"ip", "route", "replace", "10.244.2.0/24", "via", "192.168.77.3", "dev", "eth0"}, func(r Repairs) uint64 { return r.Route }},
		{"stray route", []string{"ip", "route", "add", "10.99.0.0/16", "dev", "weft.1"}, func(r Repairs) uint64 { return r.Route }},
		{"device", []string{"ip", "link", "del", "weft.1"}, func(r Repairs) uint64 { return r.Device }},
		{"device down", []string{"ip", "link", "set", "weft-v6.1", "down"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := b.Repairs()
			nettest.MustRun(t, n1, tc.argv...)
			took := waitState(t, n1.NS, "weft.1", want4)
			took = max(took, waitState(t, n1.NS, "weft-v6.1", want6))
			t.Logf("repaired in %v", took)
			if took > 2*time.Second {
				t.Errorf("repaired in %v, want within about a second (notification, debounce, sync)", took)
			}
			if tc.count != nil {
				eventually(t, time.Second, "repair counter", func() (bool, string) {
					return tc.count(b.Repairs()) > tc.count(before), ""
				})
			}
			for _, name := range []string{"weft.1", "weft-v6.1"} {
				l, err := n1.Handle.LinkByName(name)
				if err != nil {
					t.Fatal(err)
				}
				if l.Attrs().Flags&1 == 0 {
					t.Errorf("%s is down", name)
				}
				if name == "weft.1" && l.Attrs().HardwareAddr.String() != wantMAC.String() {
					t.Errorf("%s mac %s, want %s", name, l.Attrs().HardwareAddr, wantMAC)
				}
			}
		})
	}
	t.Logf("repairs: %+v", b.Repairs())
}

// TestSubnetChange restarts with another node subnet: the device keeps its
// index and MAC and swaps the old gateway address for the new one.
func TestSubnetChange(t *testing.T) {
	u := nettest.NewUnderlay(t, ul4, 0)
	n1 := newNode(t, u, 1)
	b := newBackend(t, n1.config())
	b.Set(peerTable())
	stop := start(t, b)
	waitReady(t, b)
	stop()
	before, _ := n1.Handle.LinkByName("weft.1")

	c := n1.config()
	c.Subnet = netip.MustParsePrefix("10.244.42.0/24")
	c.IPv6Subnet = netip.MustParsePrefix("fd00:10:244:42::/64")
	b2 := newBackend(t, c)
	b2.Set(peerTable())
	start(t, b2)
	waitReady(t, b2)
	after, _ := n1.Handle.LinkByName("weft.1")
	if before.Attrs().Index != after.Attrs().Index {
		t.Errorf("device recreated for a subnet change")
	}
	for dev, want := range map[string]string{
		"weft.1":    "10.244.42.0/32",
		"weft-v6.1": "fd00:10:244:42::/128",
	} {
		got := lines(t, n1.NS, "ip", "-o", "addr", "show", "dev", dev, "scope", "global")
		if len(got) != 1 || !strings.Contains(got[0], " "+want+" ") {
			t.Errorf("%s addresses: %q, want only %s", dev, got, want)
		}
	}
}

// TestRunReturnsCleanly: Run's goroutines (its own and netlink's
// subscriptions) are gone once it has returned.
func TestRunReturnsCleanly(t *testing.T) {
	u := nettest.NewUnderlay(t, ul4, 0)
	n1 := newNode(t, u, 1)
	base := runtime.NumGoroutine()
	for range 3 {
		b := newBackend(t, n1.config())
		b.Set(peerTable())
		stop := start(t, b)
		waitReady(t, b)
		stop()
	}
	eventually(t, 2*time.Second, "goroutines back to the baseline", func() (bool, string) {
		n := runtime.NumGoroutine()
		return n <= base, fmt.Sprintf("%d goroutines, baseline %d", n, base)
	})
}

// TestDeviceOptions: GBP, Learning, port and VNI reach the device, and
// turning GBP on recreates a device made without it.
func TestDeviceOptions(t *testing.T) {
	u := nettest.NewUnderlay(t, ul4, 0)
	n1 := newNode(t, u, 1)
	c := n1.config()
	c.LocalIPv6, c.IPv6Subnet = netip.Addr{}, netip.Prefix{}
	c.VNI, c.Port = 4096, 4789
	b := newBackend(t, c)
	b.Set(vtep.Table{})
	stop := start(t, b)
	waitReady(t, b)
	stop()
	first, err := n1.Handle.LinkByName("weft.4096")
	if err != nil {
		t.Fatal(err)
	}
	c.GBP, c.Learning = true, true
	b = newBackend(t, c)
	b.Set(vtep.Table{})
	start(t, b)
	waitReady(t, b)
	l, err := n1.Handle.LinkByName("weft.4096")
	if err != nil {
		t.Fatal(err)
	}
	v := l.(*netlink.Vxlan)
	if !v.GBP || !v.Learning || v.Port != 4789 || v.VxlanId != 4096 || v.VtepDevIndex != n1.underlay {
		t.Errorf("device %+v", v)
	}
	if v.Index == first.Attrs().Index {
		t.Error("device without GBP was adopted instead of recreated")
	}
	if v.HardwareAddr.String() != first.Attrs().HardwareAddr.String() {
		t.Errorf("recreated device changed MAC: %s → %s", first.Attrs().HardwareAddr, v.HardwareAddr)
	}
}
