package uvxlan

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/namespace"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/internal/testkit/testlog"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
	"golang.org/x/sys/unix"
)

// sendFrom sends each datagram to dst:8472 from a socket bound to src in
// the namespace n, allowing fragmentation.
func sendFrom(t *testing.T, n *nettest.NS, src, dst netip.Addr, datagrams ...[]byte) {
	t.Helper()
	sendFromCsum(t, n, src, dst, true, datagrams...)
}

// sendFromCsum is sendFrom; without csum the datagrams carry no UDP
// checksum, which also makes them cross a veth with no checksum offload
// state: the receiving stack then checks the inner checksums itself, as for
// a packet from a NIC.
func sendFromCsum(t *testing.T, n *nettest.NS, src, dst netip.Addr, csum bool, datagrams ...[]byte) {
	t.Helper()
	var c *net.UDPConn
	if err := n.Do(func() (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rc, _ := c.SyscallConn()
	rc.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DONT)
		if !csum {
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_NO_CHECK, 1)
		}
	})
	for _, d := range datagrams {
		if _, err := c.WriteToUDPAddrPort(d, netip.AddrPortFrom(dst, 8472)); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
}

// waitDrops waits until the backend has counted want drops for reason.
func waitDrops(t *testing.T, b *Backend, reason DropReason, want uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := b.Stats().Drops[reason.String()]
		if got == want {
			return
		}
		if got > want || time.Now().After(deadline) {
			t.Fatalf("%s drops: %d, want %d (stats %+v)", reason, got, want, b.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// icmpFrame is an Ethernet frame carrying an ICMP echo request to dst.
func icmpFrame(dstMAC, srcMAC subnet.MAC, src, dst netip.Addr, size int) []byte {
	f := make([]byte, ethHeaderLen+20+8+size)
	copy(f, dstMAC[:])
	copy(f[6:], srcMAC[:])
	binary.BigEndian.PutUint16(f[12:], etherTypeIPv4)
	ip := f[ethHeaderLen:]
	ip[0], ip[8], ip[9] = 0x45, 64, 1
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	copy(ip[12:], src.AsSlice())
	copy(ip[16:], dst.AsSlice())
	binary.BigEndian.PutUint16(ip[10:], ^checksumFold(checksumAdd(ip[:20], 0)))
	ip[20] = 8
	binary.BigEndian.PutUint16(ip[22:], ^checksumFold(checksumAdd(ip[20:], 0)))
	return f
}

// TestIngressFiltering sends hostile and broken datagrams to a uvxlan node
// and checks that each is dropped under its reason while traffic goes on.
//
// With the fast path on, each meets the ingress program's checks first: it
// must still reach the userspace path and be counted there. Frames with
// corrupted inner checksums are the exception: the fast path leaves those
// to the receiving stack, which must drop them. A single datagram whose
// lengths do not agree must go on to the userspace path without handing
// the peer over.
func TestIngressFiltering(t *testing.T) {
	for _, fast := range []bool{false, true} {
		t.Run(fmt.Sprintf("fastpath=%v", fast), func(t *testing.T) { testIngressFiltering(t, fast) })
	}
}

func testIngressFiltering(t *testing.T, fast bool) {
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	a := newUVNodeWith(t, u, "a", subnetA, func(c *Config) { c.FastPath = fast })
	b := newKernelNode(t, u, "b", subnetB)
	evil := u.AddHost(t, "evil", "eth0")
	connect(t, a, b)

	good := icmpFrame(a.mac, b.mac, b.podIP, a.podIP, 56)
	// Inner frames that pass the VXLAN checks but not the inner ones.
	foreign := icmpFrame(a.mac, b.mac, netip.MustParseAddr("10.244.9.9"), a.podIP, 56)
	fromGateway := icmpFrame(a.mac, b.mac, netip.MustParseAddr("10.244.3.1"), a.podIP, 56)
	arp := make([]byte, ethHeaderLen+28)
	copy(arp, a.mac[:])
	copy(arp[6:], b.mac[:])
	binary.BigEndian.PutUint16(arp[12:], 0x0806)
	badSum := withMACs(innerFrame(b.podIP, a.podIP, protoTCP, 100, stateCorrupt), a.mac, b.mac)
	badUDP := withMACs(innerFrame(b.podIP, a.podIP, protoUDP, 100, stateCorrupt), a.mac, b.mac)
	badFlags := encap(1, good)
	badFlags[0] = 0x0c
	reserved := encap(1, good)
	reserved[7] = 1
	for _, tc := range []struct {
		name   string
		from   *nettest.Host
		pkts   [][]byte
		reason DropReason
		// The fast path leaves inner checksums to the receiving stack, as
		// the kernel's VXLAN does (see the package documentation): checked
		// after the table.
		userspaceOnly bool
	}{
		{"valid packet from a non-peer", evil, [][]byte{encap(1, good), encap(1, good), encap(1, good)}, DropNotPeer, false},
		{"wrong vni", b.host, [][]byte{encap(2, good), encap(0, good)}, DropWrongVNI, false},
		{"bad flags", b.host, [][]byte{badFlags, reserved}, DropBadFlags, false},
		{"garbage", b.host, [][]byte{[]byte("hello"), {}, make([]byte, 21)}, DropTruncated, false},
		{"other destination mac", b.host, [][]byte{encap(1, icmpFrame(b.mac, b.mac, b.podIP, a.podIP, 56))}, DropNotForUs, false},
		{"broadcast", b.host, [][]byte{encap(1, icmpFrame(subnet.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, b.mac, b.podIP, a.podIP, 56))}, DropNotForUs, false},
		{"inner source outside the sender's subnet", b.host, [][]byte{encap(1, foreign), encap(1, foreign), encap(1, fromGateway)}, DropForeignSource, false},
		{"arp", b.host, [][]byte{encap(1, arp)}, DropEtherType, false},
		{"corrupted inner checksum", b.host, [][]byte{encap(1, badSum), encap(1, badUDP)}, DropBadChecksum, true},
		{"oversize (fragmented underlay)", b.host, [][]byte{encap(1, icmpFrame(a.mac, b.mac, b.podIP, a.podIP, 1500))}, DropOversize, false},
	} {
		if fast && tc.userspaceOnly {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			st := a.b.Stats()
			before := st.Drops[tc.reason.String()]
			src := tc.from.Addr
			sendFrom(t, tc.from.NS, src, a.host.Addr, tc.pkts...)
			waitDrops(t, a.b, tc.reason, before+uint64(len(tc.pkts)))
			if got := a.b.Stats().Events[EventFastRxFrames]; got != st.Events[EventFastRxFrames] {
				t.Errorf("the fast path took %d of them", got-st.Events[EventFastRxFrames])
			}
			if out, err := ping(b, a.podIP); err != nil {
				t.Fatalf("forwarding stopped: %v\n%s", err, out)
			}
		})
	}
	if !fast {
		return
	}
	t.Run("corrupted inner checksum through the fast path", func(t *testing.T) {
		st := a.b.Stats()
		errs := func() uint64 { return nstatSum(t, a.pod, "TcpInCsumErrors", "UdpInCsumErrors") }
		before := errs()
		sendFromCsum(t, b.host.NS, b.host.Addr, a.host.Addr, false, encap(1, badSum), encap(1, badUDP))
		eventually(t, "the pod's stack drops both", func() error {
			if n := errs() - before; n != 2 {
				return fmt.Errorf("%d checksum errors in a's pod", n)
			}
			return nil
		})
		if n := a.b.Stats().Events[EventFastRxFrames] - st.Events[EventFastRxFrames]; n != 2 {
			t.Errorf("the fast path took %d of the 2 frames", n)
		}
	})
	t.Run("trailing bytes", func(t *testing.T) {
		st := a.b.Stats()
		padded := append(encap(1, good), 0xaa, 0xbb)
		sendFrom(t, b.host.NS, b.host.Addr, a.host.Addr, padded, padded)
		eventually(t, "the userspace path sees both", func() error {
			if n := a.b.Stats().Events[EventIngressWakeups] - st.Events[EventIngressWakeups]; n == 0 {
				return errors.New("no ingress wake-up")
			}
			return nil
		})
		after := a.b.Stats()
		if n := after.Events[EventFastRxFrames] - st.Events[EventFastRxFrames]; n != 0 {
			t.Errorf("the fast path took %d padded datagrams", n)
		}
		if n := after.Events[EventFastDemoted]; n != 0 {
			t.Errorf("padded single datagrams handed the peer over (%d)", n)
		}
	})
}

// nstatSum returns the sum of the named nstat counters in n.
func nstatSum(t *testing.T, n *nettest.NS, names ...string) uint64 {
	t.Helper()
	out := nettest.MustRun(t, n, append([]string{"nstat", "-az"}, names...)...)
	var sum uint64
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && slices.Contains(names, f[0]) {
			v, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			sum += v
		}
	}
	return sum
}

// withMACs sets the destination and source MAC of an Ethernet frame.
func withMACs(f []byte, dst, src subnet.MAC) []byte {
	copy(f, dst[:])
	copy(f[6:], src[:])
	return f
}

// TestWireFormat captures the underlay with tcpdump and decodes the
// datagrams a uvxlan node sends to a kernel VXLAN node by hand.
func TestWireFormat(t *testing.T) {
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	a := newUVNode(t, u, "a", subnetA, false)
	b := newKernelNode(t, u, "b", subnetB)
	connect(t, a, b)

	pcap := filepath.Join(t.TempDir(), "underlay.pcap")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := u.NS.Command(ctx, "tcpdump", "-i", namespace.UnderlayBridge, "-U", "-n", "-c", "6", "-w", pcap, "udp")
	stderr := &testlog.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(stderr.String(), "listening on") {
		if ctx.Err() != nil {
			t.Fatalf("tcpdump did not start: %s", stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out, err := ping(a, b.podIP); err != nil {
		t.Fatalf("ping: %v\n%s", err, out)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("tcpdump: %v: %s", err, stderr)
	}
	lo, hi := localPortRange(t, a.host.NS)
	pkts := readPcap(t, pcap)
	var fromA int
	for _, p := range pkts {
		w, err := parseUnderlay(p)
		if err != nil {
			t.Fatalf("captured packet: %v", err)
		}
		if w.dstPort != 8472 {
			t.Fatalf("udp destination port %d, want 8472", w.dstPort)
		}
		if w.src != a.host.Addr {
			continue
		}
		fromA++
		if w.df {
			t.Errorf("outer DF set")
		}
		if w.ttl != 64 {
			t.Errorf("outer ttl %d, want 64", w.ttl)
		}
		if want := [8]byte{0x08, 0, 0, 0, 0, 0, 1, 0}; w.vxlan != want {
			t.Errorf("vxlan header % x, want % x", w.vxlan, want)
		}
		if w.innerDst != b.mac || w.innerSrc != a.mac {
			t.Errorf("inner frame %s → %s, want %s → %s", w.innerSrc, w.innerDst, a.mac, b.mac)
		}
		if w.srcPort < lo || w.srcPort > hi {
			t.Errorf("source port %d outside the local port range %d-%d", w.srcPort, lo, hi)
		}
	}
	if fromA == 0 {
		t.Fatalf("no datagram from %s among %d captured", a.host.Addr, len(pkts))
	}
}

func localPortRange(t *testing.T, n *nettest.NS) (uint16, uint16) {
	out := nettest.MustRun(t, n, "cat", "/proc/sys/net/ipv4/ip_local_port_range")
	var lo, hi uint16
	if _, err := fmt.Sscan(out, &lo, &hi); err != nil {
		t.Fatalf("parse port range %q: %v", out, err)
	}
	return lo, hi
}

// readPcap returns the packets of a classic little-endian pcap file.
func readPcap(t *testing.T, path string) [][]byte {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 24 || binary.LittleEndian.Uint32(b) != 0xa1b2c3d4 {
		t.Fatalf("not a little-endian pcap file")
	}
	var pkts [][]byte
	for b = b[24:]; len(b) >= 16; {
		n := int(binary.LittleEndian.Uint32(b[8:]))
		if len(b) < 16+n {
			break
		}
		pkts = append(pkts, b[16:16+n])
		b = b[16+n:]
	}
	return pkts
}

type underlayPacket struct {
	src              netip.Addr
	ttl              uint8
	df               bool
	srcPort, dstPort uint16
	vxlan            [8]byte
	innerDst         subnet.MAC
	innerSrc         subnet.MAC
}

func parseUnderlay(p []byte) (underlayPacket, error) {
	var w underlayPacket
	if len(p) < 14+20+8+8+14 || binary.BigEndian.Uint16(p[12:]) != etherTypeIPv4 {
		return w, fmt.Errorf("not an IPv4 VXLAN packet: % x", p[:min(len(p), 40)])
	}
	ip := p[14:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[9] != 17 {
		return w, fmt.Errorf("protocol %d, not udp", ip[9])
	}
	w.src = netip.AddrFrom4([4]byte(ip[12:16]))
	w.ttl = ip[8]
	w.df = ip[6]&0x40 != 0
	udp := ip[ihl:]
	w.srcPort, w.dstPort = binary.BigEndian.Uint16(udp), binary.BigEndian.Uint16(udp[2:])
	w.vxlan = [8]byte(udp[8:16])
	w.innerDst, w.innerSrc = subnet.MAC(udp[16:22]), subnet.MAC(udp[22:28])
	return w, nil
}

// TestPeerChurn swaps the peer table continuously while TCP transfers run
// in both directions: no crash, no race (go test -race), no lost peer.
func TestPeerChurn(t *testing.T) {
	for _, fast := range []bool{false, true} {
		t.Run(fmt.Sprintf("fastpath=%v", fast), func(t *testing.T) { testPeerChurn(t, fast) })
	}
}

func testPeerChurn(t *testing.T, fast bool) {
	u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
	a := newUVNodeWith(t, u, "a", subnetA, func(c *Config) { c.FastPath = fast })
	b := newUVNodeWith(t, u, "b", subnetB, func(c *Config) { c.FastPath = fast })
	connect(t, a, b)
	base := vtep.Table{b.subnet: {MAC: b.mac, Addr: b.host.Addr}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			tab := vtep.Table{b.subnet: base[b.subnet]}
			for j := range i % 20 {
				p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 245, byte(j), 0}), 24)
				tab[p] = vtep.Peer{MAC: subnet.MAC{2, 0, 0, 0, 0, byte(j)}, Addr: netip.AddrFrom4([4]byte{192, 168, 78, byte(j + 1)})}
			}
			a.b.Set(tab)
			a.b.Stats()
			time.Sleep(time.Millisecond)
		}
	}()
	errc := make(chan error, 2)
	for _, d := range [][2]*testNode{{a, b}, {b, a}} {
		go func() { errc <- transferErr(d[0], d[1], 30<<20) }()
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
	cancel()
	wg.Wait()
	a.b.Set(base)
	if out, err := ping(a, b.podIP); err != nil {
		t.Fatalf("ping after churn: %v\n%s", err, out)
	}
	if fast {
		checkFastMaps(t, a.b, base)
		checkFastCounters(t, a.b.Stats(), true)
	}
	// The reconciler converges on the last table: only b's route is left.
	deadline := time.Now().Add(5 * time.Second)
	for {
		routes := nettest.MustRun(t, a.host, "ip", "route", "show", "dev", "weft-u.1")
		if !strings.Contains(routes, "10.245.") && strings.Contains(routes, b.subnet.String()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("routes did not converge:\n%s", routes)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
