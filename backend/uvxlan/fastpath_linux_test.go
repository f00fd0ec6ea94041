package uvxlan

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
	"golang.org/x/sys/unix"
)

func newFastNode(t *testing.T, u *nettest.Underlay, label string, sn netip.Prefix) *testNode {
	t.Helper()
	return newUVNodeWith(t, u, label, sn, func(c *Config) { c.FastPath = true })
}

// podRx returns the bytes and frames n's pod received on its eth0.
func podRx(t *testing.T, n *testNode) [2]uint64 {
	t.Helper()
	out := nettest.MustRun(t, n.pod, "ip", "-j", "-s", "link", "show", "dev", "eth0")
	var links []struct {
		Stats64 struct {
			RX struct {
				Bytes   uint64 `json:"bytes"`
				Packets uint64 `json:"packets"`
			} `json:"rx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
		t.Fatalf("ip -j -s link show dev eth0: %v: %s", err, out)
	}
	return [2]uint64{links[0].Stats64.RX.Bytes, links[0].Stats64.RX.Packets}
}

// checkFastMaps checks that b's fast path maps hold exactly t's peers.
func checkFastMaps(t *testing.T, b *Backend, tab vtep.Table) {
	t.Helper()
	if d := fastMapsDiff(b, tab); d != "" {
		t.Error(d)
	}
}

// fastMapsDiff says how b's fast path maps differ from t's peers ("" when
// they hold exactly those).
func fastMapsDiff(b *Backend, tab vtep.Table) string {
	want := map[string]bool{}
	for p, v := range tab {
		var k txKey
		copy(k[:], v.MAC[:])
		want[fmt.Sprintf("tx %x → %s", k, v.Addr)] = true
		want[fmt.Sprintf("rx %d %s %s", 32+p.Bits(), v.Addr, p.Masked().Addr())] = true
	}
	got := map[string]bool{}
	var tk txKey
	var ta [4]byte
	for it := b.fast.tx.Iterate(); it.Next(&tk, &ta); {
		got[fmt.Sprintf("tx %x → %s", tk, netip.AddrFrom4(ta))] = true
	}
	var rk rxKey
	var rv uint32
	for it := b.fast.rx.Iterate(); it.Next(&rk, &rv); {
		got[fmt.Sprintf("rx %d %s %s", rk.Bits, netip.AddrFrom4(rk.Outer), netip.AddrFrom4(rk.Inner))] = true
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Sprintf("fast path maps:\n%v\nwant\n%v", got, want)
	}
	return ""
}

// attachedPrograms returns how many tcx programs are attached to the named
// device in n for attach.
func attachedPrograms(t *testing.T, n *nettest.NS, dev string, attach ebpf.AttachType) int {
	t.Helper()
	var count int
	err := n.Do(func() error {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		res, err := link.QueryPrograms(link.QueryOptions{Target: ifi.Index, Attach: attach})
		if err != nil {
			return err
		}
		count = len(res.Programs)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return count
}

// TestFastPath checks what the fast path must get right beyond carrying
// traffic (TestEndToEnd): super-packets decapsulated into a bridge, a peer
// whose super-packets only the userspace path can take (so that no flow is
// reordered between the two), no UDP GRO, a peer routed through
// another device, re-attaching after the TAP is replaced, and leaving
// nothing attached when Run returns.
func TestFastPath(t *testing.T) {
	t.Run("pod behind a bridge", func(t *testing.T) {
		// Decapsulated super-packets keep the tunnel's GSO marks, so the
		// bridge would cut them into segments; the bridge program on its
		// egress hands them to the pod's port whole. The bridge is made
		// after the backends start, as the CNI plugin's first pod makes
		// it; then b's pod is wired anew (a new host veth and MAC), and
		// the ports map must follow.
		// No periodic full sync: the kernel's notifications of the bridge
		// and of its forwarding database must do it.
		u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
		noResync := func(c *Config) { c.FastPath, c.Reconcile = true, time.Hour }
		a := newUVNodeWith(t, u, "a", subnetA, noResync)
		b := newUVNodeWith(t, u, "b", subnetB, noResync)
		for _, n := range []*testNode{a, b} {
			gw := netip.PrefixFrom(n.subnet.Addr().Next(), n.subnet.Bits()).String()
			h := n.host
			nettest.MustRun(t, h, "ip", "addr", "del", gw, "dev", "vpod")
			nettest.MustRun(t, h, "ip", "link", "add", DefaultPodBridge, "mtu", fmt.Sprint(n.mtu), "type", "bridge")
			nettest.MustRun(t, h, "ip", "link", "set", "vpod", "master", DefaultPodBridge)
			nettest.MustRun(t, h, "ip", "addr", "add", gw, "dev", DefaultPodBridge, "nodad")
			nettest.MustRun(t, h, "ip", "link", "set", DefaultPodBridge, "up")
			nettest.MustRun(t, n.pod, "ip", "route", "replace", "default", "via", n.subnet.Addr().Next().String())
		}
		connect(t, a, b)
		transfer(t, a, b, 100<<20)
		transfer(t, b, a, 100<<20)
		checkFastCounters(t, a.b.Stats(), true)
		checkFastCounters(t, b.b.Stats(), true)
		checkWhole := func(n *testNode, size int64) {
			t.Helper()
			before, passed := podRx(t, n), n.b.Stats().Events[EventFastBridgePassed]
			transfer(t, map[*testNode]*testNode{a: b, b: a}[n], n, size)
			after := podRx(t, n)
			frames, bytes := after[1]-before[1], after[0]-before[0]
			t.Logf("%s's pod received %d bytes in %d frames; %d super-packets past the bridge", n.host.Name, bytes, frames, n.b.Stats().Events[EventFastBridgePassed]-passed)
			if n.b.Stats().Events[EventFastBridgePassed] == passed {
				t.Errorf("%s: no super-packet passed the bridge", n.host.Name)
			}
			if frames == 0 || bytes/frames < uint64(2*n.mtu) {
				t.Errorf("%s's pod received %d bytes in %d frames: super-packets were cut into segments", n.host.Name, bytes, frames)
			}
		}
		checkWhole(b, 50<<20)
		checkWhole(a, 50<<20)
		// weftctl's inspect (peers, explain, doctor) names the programs.
		tap, err := a.host.Handle.LinkByName(DeviceName(1))
		if err != nil {
			t.Fatal(err)
		}
		ul, err := a.host.Handle.LinkByName(a.host.Link)
		if err != nil {
			t.Fatal(err)
		}
		fp, err := inspect.ReadFastPath(a.host.Do, tap.Attrs().Index, ul.Attrs().Index)
		if err != nil || !fp.Attached() || fp.Bridge != DefaultPodBridge {
			t.Errorf("inspect reads %+v, %v; want both programs and the bridge program on %s", fp, err, DefaultPodBridge)
		}
		h := b.host
		nettest.MustRun(t, h, "ip", "link", "del", "vpod")
		nettest.Veth(t, h.NS, "vpod2", b.pod, "eth0")
		nettest.MustRun(t, h, "ip", "link", "set", "vpod2", "mtu", fmt.Sprint(b.mtu), "master", DefaultPodBridge)
		nettest.MustRun(t, b.pod, "ip", "link", "set", "eth0", "mtu", fmt.Sprint(b.mtu))
		nettest.MustRun(t, b.pod, "ip", "addr", "add", netip.PrefixFrom(b.podIP, b.subnet.Bits()).String(), "dev", "eth0", "nodad")
		nettest.MustRun(t, b.pod, "ip", "route", "add", "default", "via", b.subnet.Addr().Next().String())
		checkWhole(b, 50<<20)
	})

	t.Run("userspace peer is handed to the userspace path", func(t *testing.T) {
		// b runs the userspace path only: its UDP GSO sends cross the
		// veth as one skb each, which a's ingress program cannot take. Had
		// it gone on taking b's single datagrams meanwhile, these would
		// overtake the GSO runs queued on the userspace path before them.
		// So the first such skb hands b to a's userspace path for good.
		u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
		a := newFastNode(t, u, "a", subnetA)
		b := newUVNode(t, u, "b", subnetB, false)
		connect(t, a, b)
		transfer(t, b, a, 1<<20)
		st := a.b.Stats()
		if st.Events[EventFastDemoted] != 1 {
			t.Fatalf("peers handed to the userspace path: %d, want 1 (%v)", st.Events[EventFastDemoted], st.Events)
		}
		transfer(t, b, a, 100<<20)
		transfer(t, a, b, 20<<20)
		after := a.b.Stats()
		if n := after.Events[EventFastRxFrames] - st.Events[EventFastRxFrames]; n != 0 {
			t.Errorf("the fast path took %d of b's frames after it handed b over", n)
		}
		if after.Events[EventFastDemoted] != 1 {
			t.Errorf("peers handed to the userspace path: %d, want still 1", after.Events[EventFastDemoted])
		}
		// A Set with the same table keeps b where it is.
		a.b.Set(vtep.Table{b.subnet: {MAC: b.mac, Addr: b.host.Addr}})
		transfer(t, b, a, 10<<20)
		if n := a.b.Stats().Events[EventFastRxFrames] - st.Events[EventFastRxFrames]; n != 0 {
			t.Errorf("after a Set, the fast path took %d of b's frames", n)
		}
		// a's own sends still take the fast path.
		checkFastCounters(t, after, false)
	})

	t.Run("a fast node's restart does not hand it over", func(t *testing.T) {
		// Between its Run's start and the programs' attaching, a fast node's
		// userspace path carries the frames its TAP queued; were they sent
		// as UDP GSO super-packets, the peer's ingress program would hand
		// the node to its userspace path for good.
		u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
		a := newFastNode(t, u, "a", subnetA)
		b := newFastNode(t, u, "b", subnetB)
		connect(t, a, b)
		errc := make(chan error, 1)
		go func() { errc <- transferErr(b, a, 200<<20) }()
		for range 3 {
			time.Sleep(200 * time.Millisecond)
			b.stop()
			b.stop = start(t, b.b, "b")
			t.Cleanup(b.stop)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		st := a.b.Stats()
		if n := st.Events[EventFastDemoted]; n != 0 {
			t.Errorf("b handed to a's userspace path (%d) by its restarts", n)
		}
		checkFastCounters(t, st, false)
	})

	t.Run("receive sockets do not ask for udp gro", func(t *testing.T) {
		// On a device that does GRO (a NIC), a receive socket that asks for
		// UDP GRO has the kernel merge a peer's checksummed datagrams
		// before the ingress program sees them, and merged ones can only
		// take the userspace path, behind single ones of the same flows.
		// (A veth here did not merge them in any setting tried, so the
		// rule is checked, not its effect.)
		u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
		for _, fast := range []bool{true, false} {
			n := newUVNodeWith(t, u, fmt.Sprint("n", fast), subnetA, func(c *Config) { c.FastPath = fast })
			eventually(t, "running", func() error {
				if n.b.dp.Load() == nil {
					return errors.New("not yet")
				}
				return nil
			})
			s := n.b.dp.Load().rxs[0].Load()
			var gro int
			var serr error
			if err := s.rc.Control(func(fd uintptr) { gro, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO) }); err != nil || serr != nil {
				t.Fatal(err, serr)
			}
			if want := !fast; (gro != 0) != want {
				t.Errorf("fast path %v: UDP_GRO %d on the receive socket, want %v", fast, gro, want)
			}
			n.stop()
		}
	})

	t.Run("peer routed through another device", func(t *testing.T) {
		// The egress program sends through the device that holds the
		// local address only: a peer reached through another device must
		// take the userspace path.
		u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
		a := newFastNode(t, u, "a", subnetA)
		b := newFastNode(t, u, "b", subnetB)
		nettest.MustRun(t, a.host, "ip", "link", "add", "other0", "type", "veth", "peer", "name", "other1")
		nettest.MustRun(t, a.host, "ip", "link", "set", "other0", "up")
		nettest.MustRun(t, a.host, "ip", "link", "set", "other1", "up")
		nettest.MustRun(t, a.host, "ip", "route", "add", "192.168.78.0/24", "dev", "other0")
		connect(t, a, b)
		far := vtep.Peer{MAC: [6]byte{2, 0, 0, 0, 0, 0x78}, Addr: netip.MustParseAddr("192.168.78.5")}
		tab := vtep.Table{b.subnet: {MAC: b.mac, Addr: b.host.Addr}, netip.MustParsePrefix("10.244.9.0/24"): far}
		a.b.Set(tab)
		eventually(t, "the far peer left to the userspace path", func() error {
			if n := a.b.Stats().Events[EventFastOffDevice]; n != 1 {
				return fmt.Errorf("%d peers off the device", n)
			}
			return nil
		})
		checkFastMaps(t, a.b, vtep.Table{b.subnet: {MAC: b.mac, Addr: b.host.Addr}})
		transfer(t, a, b, 20<<20)
		checkFastCounters(t, a.b.Stats(), true)
	})

	t.Run("reattaches to a recreated underlay at once", func(t *testing.T) {
		// The egress program sends through the underlay by its index: a
		// recreated underlay (new index) must be noticed from the
		// notifications, not only at the periodic sync (an hour here).
		u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
		a := newUVNodeWith(t, u, "a", subnetA, func(c *Config) { c.FastPath = true; c.Reconcile = time.Hour })
		b := newFastNode(t, u, "b", subnetB)
		connect(t, a, b)
		if out, err := ping(a, b.podIP); err != nil {
			t.Fatalf("ping: %v\n%s", err, out)
		}
		nettest.MustRun(t, a.host, "ip", "link", "del", "eth0")
		nettest.Veth(t, a.host.NS, "eth0", u.NS, "a-again")
		if err := namespace.Enslave(u.NS, "a-again", namespace.UnderlayBridge); err != nil {
			t.Fatal(err)
		}
		nettest.MustRun(t, a.host, "ip", "addr", "add", netip.PrefixFrom(a.host.Addr, 24).String(), "dev", "eth0")
		eventually(t, "fast path attached to the new underlay", func() error {
			if st := a.b.Stats(); st.Events[EventFastAttaches] != 2 {
				return fmt.Errorf("events %v", st.Events)
			}
			return nil
		})
		sent := a.b.Stats().Events[EventFastTxFrames]
		eventually(t, "ping over the new underlay", func() error {
			if out, err := ping(a, b.podIP); err != nil {
				return fmt.Errorf("%w\n%s", err, out)
			}
			return nil
		})
		if got := a.b.Stats().Events[EventFastTxFrames]; got <= sent {
			t.Errorf("no frame took the fast path after the repair (%d, %d before)", got, sent)
		}
	})

	t.Run("reattaches to a new tap and detaches on stop", func(t *testing.T) {
		u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
		a := newFastNode(t, u, "a", subnetA)
		b := newFastNode(t, u, "b", subnetB)
		connect(t, a, b)
		checkFastMaps(t, a.b, vtep.Table{b.subnet: {MAC: b.mac, Addr: b.host.Addr}})
		if out, err := ping(a, b.podIP); err != nil {
			t.Fatalf("ping: %v\n%s", err, out)
		}
		nettest.MustRun(t, a.host, "ip", "link", "del", "weft-u.1")
		eventually(t, "fast path attached again", func() error {
			if st := a.b.Stats(); st.Repairs[repairFastPath] != 1 || st.Events[EventFastAttaches] != 2 {
				return fmt.Errorf("repairs %v, events %v", st.Repairs, st.Events)
			}
			return nil
		})
		sent := a.b.Stats().Events[EventFastTxFrames]
		eventually(t, "ping after the repair", func() error {
			if out, err := ping(a, b.podIP); err != nil {
				return fmt.Errorf("%w\n%s", err, out)
			}
			return nil
		})
		if got := a.b.Stats().Events[EventFastTxFrames]; got <= sent {
			t.Errorf("no frame took the fast path after the repair (%d, %d before)", got, sent)
		}
		nettest.MustRun(t, a.host, "ip", "link", "add", DefaultPodBridge, "type", "bridge")
		hooks := []struct {
			dev    string
			attach ebpf.AttachType
		}{{"weft-u.1", ebpf.AttachTCXEgress}, {"eth0", ebpf.AttachTCXIngress}, {DefaultPodBridge, ebpf.AttachTCXEgress}}
		eventually(t, "bridge program attached", func() error {
			if n := attachedPrograms(t, a.host.NS, DefaultPodBridge, ebpf.AttachTCXEgress); n != 1 {
				return fmt.Errorf("%d programs on the bridge's egress", n)
			}
			return nil
		})
		for _, c := range hooks {
			if n := attachedPrograms(t, a.host.NS, c.dev, c.attach); n != 1 {
				t.Errorf("%s %v: %d programs attached while running, want 1", c.dev, c.attach, n)
			}
		}
		a.stop()
		for _, c := range hooks {
			if n := attachedPrograms(t, a.host.NS, c.dev, c.attach); n != 0 {
				t.Errorf("%s %v: %d programs attached after Run returned", c.dev, c.attach, n)
			}
		}
	})
}

// TestFastPathSetPeers checks the maps' contents as tables change: IPv4
// peers only, every subnet of a peer, removals, and AllowForeignSources.
func TestFastPathSetPeers(t *testing.T) {
	nettest.RequireRoot(t)
	f, err := newFastPath()
	if err != nil {
		t.Fatal(err)
	}
	defer f.closeMaps()
	b := &Backend{fast: f}
	mac := func(i byte) vtep.Peer {
		return vtep.Peer{MAC: [6]byte{2, 0, 0, 0, 0, i}, Addr: netip.AddrFrom4([4]byte{192, 168, 0, i})}
	}
	v6 := vtep.Peer{MAC: [6]byte{2, 0, 0, 0, 0, 9}, Addr: netip.MustParseAddr("fd00::9")}
	sn := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	tables := []vtep.Table{
		{sn("10.244.1.0/24"): mac(1), sn("10.244.2.0/24"): mac(2), sn("fd00:1::/64"): v6},
		{sn("10.244.1.0/24"): mac(1), sn("10.244.3.0/24"): mac(3)},
		{},
	}
	for i, tab := range tables {
		if _, err := f.setTable(tab, false); err != nil {
			t.Fatal(err)
		}
		want := vtep.Table{}
		for p, v := range tab {
			if p.Addr().Is4() {
				want[p] = v
			}
		}
		t.Run(fmt.Sprint("table ", i), func(t *testing.T) { checkFastMaps(t, b, want) })
	}
	// AllowForeignSources: one entry per peer that matches any inner source.
	// A peer's address changes; another is off the underlay device.
	moved := mac(1)
	moved.Addr = netip.MustParseAddr("192.168.0.11")
	tab := vtep.Table{sn("10.244.1.0/24"): moved, sn("10.244.2.0/24"): mac(2)}
	if _, err := f.setOff(map[netip.Addr]bool{mac(2).Addr: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.setTable(tab, false); err != nil {
		t.Fatal(err)
	}
	t.Run("moved and off", func(t *testing.T) { checkFastMaps(t, b, vtep.Table{sn("10.244.1.0/24"): moved}) })
	if _, err := f.setTable(vtep.Table{}, false); err != nil {
		t.Fatal(err)
	}
	if _, err := f.setOff(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := f.setTable(vtep.Table{sn("10.244.1.0/24"): mac(1)}, true); err != nil {
		t.Fatal(err)
	}
	var rk rxKey
	var rv uint32
	var keys []rxKey
	for it := f.rx.Iterate(); it.Next(&rk, &rv); {
		keys = append(keys, rk)
	}
	if len(keys) != 1 || keys[0].Bits != 32 || keys[0].Outer != [4]byte{192, 168, 0, 1} {
		t.Errorf("rx keys with foreign sources allowed: %+v", keys)
	}
	if err := f.rx.Lookup(rxKey{Bits: 64, Outer: [4]byte{192, 168, 0, 1}, Inner: [4]byte{1, 2, 3, 4}}, &rv); err != nil {
		t.Errorf("any inner source from the peer: %v", err)
	}
	if err := f.rx.Lookup(rxKey{Bits: 64, Outer: [4]byte{192, 168, 0, 2}, Inner: [4]byte{10, 244, 1, 4}}, &rv); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("another sender: %v", err)
	}
}

// TestFastPathIPv6Quiet: an IPv6 backend, which the fast path does not
// carry, reports no fast path counter, asked for it (the default) or not:
// not being there is no fault to alert on. (A node that cannot have the
// fast path reports EventFastUnavailable: test/runtimes runs weftd
// without CAP_BPF.)
func TestFastPathIPv6Quiet(t *testing.T) {
	for _, fast := range []bool{true, false} {
		b, err := New(Config{Local: netip.MustParseAddr("fd77::1"), MAC: subnet.MAC{2, 0, 0, 0, 0, 1}, FastPath: fast}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k := range b.Stats().Events {
			if strings.HasPrefix(k, "fastpath_") {
				t.Errorf("FastPath %v, IPv6: reports %s", fast, k)
			}
		}
	}
}

// TestHaveTCX: this kernel (6.6 or later, as the fast path tests need) has
// tcx; a backend whose kernel has none opens no fast path maps, so that its
// receive sockets keep asking for UDP GRO, and reports the fast path
// unavailable.
func TestHaveTCX(t *testing.T) {
	nettest.RequireRoot(t)
	if err := haveTCX(); err != nil {
		t.Fatalf("haveTCX on this kernel: %v", err)
	}
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	n := newUVNodeRun(t, u, "notcx", netip.MustParsePrefix("10.244.1.0/24"), func(c *Config) {
		c.FastPath = true
		c.haveTCX = func() error { return fmt.Errorf("probe: %w", ebpf.ErrNotSupported) }
	}, slog.New(slog.DiscardHandler), nil)
	if n.b.fast != nil {
		t.Fatal("fast path maps opened on a kernel without tcx")
	}
	dp := &datapath{b: n.b, vnet: true}
	if !dp.rxGRO() {
		t.Error("receive sockets do not ask for UDP GRO without a fast path")
	}
	if got := n.b.Stats().Events[EventFastUnavailable]; got != 1 {
		t.Errorf("%s = %d, want 1", EventFastUnavailable, got)
	}
}
