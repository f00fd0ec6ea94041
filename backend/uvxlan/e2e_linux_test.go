package uvxlan

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/backend"
	"github.com/weft-net/weft/internal/testkit/nettest"
)

var (
	subnetA = netip.MustParsePrefix("10.244.1.0/24")
	subnetB = netip.MustParsePrefix("10.244.2.0/24")
	// IPv6 pod subnets travel over an IPv6 underlay.
	subnet6A = netip.MustParsePrefix("fd00:10:244:1::/64")
	subnet6B = netip.MustParsePrefix("fd00:10:244:2::/64")
)

func TestEndToEnd(t *testing.T) {
	for _, tc := range []struct {
		name     string
		kernel   bool // node b uses kernel VXLAN
		plain    bool
		underlay string
		size     int64 // bytes of the TCP transfer
		a, b     netip.Prefix
		fast     string // "a": node a runs the fast path, "ab": both do
	}{
		{"uvxlan-uvxlan", false, false, "192.168.77.0/24", 100 << 20, subnetA, subnetB, ""},
		{"uvxlan-uvxlan-plain", false, true, "192.168.77.0/24", 20 << 20, subnetA, subnetB, ""},
		{"uvxlan-kernel", true, false, "192.168.77.0/24", 100 << 20, subnetA, subnetB, ""},
		{"uvxlan-kernel-plain", true, true, "192.168.77.0/24", 20 << 20, subnetA, subnetB, ""},
		{"uvxlan-uvxlan-ipv6", false, false, "fd77::/64", 50 << 20, subnet6A, subnet6B, ""},
		{"uvxlan-kernel-ipv6", true, false, "fd77::/64", 50 << 20, subnet6A, subnet6B, ""},
		{"uvxlan-kernel-2-queues", true, false, "192.168.77.0/24", 50 << 20, subnetA, subnetB, ""},
		{"uvxlan-uvxlan-plain-2-queues", false, true, "192.168.77.0/24", 20 << 20, subnetA, subnetB, ""},
		{"fastpath-fastpath", false, false, "192.168.77.0/24", 100 << 20, subnetA, subnetB, "ab"},
		{"fastpath-kernel", true, false, "192.168.77.0/24", 100 << 20, subnetA, subnetB, "a"},
		{"fastpath-uvxlan", false, false, "192.168.77.0/24", 50 << 20, subnetA, subnetB, "a"},
		{"fastpath-uvxlan-plain", false, true, "192.168.77.0/24", 20 << 20, subnetA, subnetB, "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := nettest.NewUnderlay(t, netip.MustParsePrefix(tc.underlay), 1500)
			queues := 1
			if strings.HasSuffix(tc.name, "2-queues") {
				queues = 2
			}
			node := func(label string, sn netip.Prefix, plain, fast bool) *testNode {
				return newUVNodeWith(t, u, label, sn, func(c *Config) { c.Plain, c.Queues, c.FastPath = plain, queues, fast })
			}
			a := node("a", tc.a, tc.plain && tc.fast == "", tc.fast != "")
			var b *testNode
			if tc.kernel {
				b = newKernelNode(t, u, "b", tc.b)
			} else {
				b = node("b", tc.b, tc.plain, tc.fast == "ab")
			}
			connect(t, a, b)
			for _, d := range []struct {
				name     string
				from, to *testNode
			}{{"a-to-b", a, b}, {"b-to-a", b, a}} {
				t.Run(d.name, func(t *testing.T) {
					if out, err := ping(d.from, d.to.podIP); err != nil {
						t.Fatalf("ping: %v\n%s", err, out)
					}
					// The largest ICMP payload that fits the overlay MTU: 1422 on a
					// 1500-byte IPv4 underlay, 1382 for IPv6 over IPv6.
					fit := d.from.mtu - 28
					if d.to.podIP.Is6() {
						fit = d.from.mtu - 48
					}
					if out, err := ping(d.from, d.to.podIP, "-M", "do", "-s", fmt.Sprint(fit)); err != nil {
						t.Fatalf("DF ping of %d bytes: %v\n%s", fit, err, out)
					}
					if out, err := ping(d.from, d.to.podIP, "-M", "do", "-s", fmt.Sprint(fit+1)); err == nil {
						t.Fatalf("DF ping of %d bytes passed a %d overlay\n%s", fit+1, d.from.mtu, out)
					}
					transfer(t, d.from, d.to, tc.size)
					if err := udpExchange(d.from, d.to, 200); err != nil {
						t.Fatalf("udp: %v", err)
					}
				})
			}
			st := a.b.Stats()
			t.Logf("a: %+v", st)
			// A kernel VXLAN node on a veth leaves inner checksums partial
			// (its underlay keeps the default offloads).
			// (With the fast path those frames never reach the userspace path.)
			if tc.kernel && tc.fast == "" && st.Events[EventPartialChecksum] == 0 {
				t.Errorf("no partial checksum counted from the kernel peer: %+v", st)
			}
			if n := st.Drops[DropBadChecksum.String()]; n != 0 {
				t.Errorf("%d frames dropped for bad checksums", n)
			}
			if tc.fast == "" {
				checkLoopCounters(t, st, tc.plain)
				return
			}
			checkFastCounters(t, st, tc.fast == "ab" || tc.kernel)
			if tc.fast == "ab" {
				checkFastCounters(t, b.b.Stats(), true)
			}
		})
	}
}

// checkLoopCounters checks a node's loop counters after traffic both ways:
// each kind moved, and with offloads the sends and TAP writes carried many
// frames each (UDP GSO, GRO), as the bulk transfers give them to do.
func checkLoopCounters(t *testing.T, st backend.Stats, plain bool) {
	t.Helper()
	for _, k := range []string{EventEgressWakeups, EventIngressWakeups, EventTAPReads, EventUDPSends, EventUDPRecvs, EventTAPWrites} {
		if st.Events[k] == 0 {
			t.Errorf("loop counter %s is 0: %+v", k, st.Events)
		}
	}
	if plain {
		return
	}
	if n := st.Events[EventUDPSends]; n > st.TxFrames/2 {
		t.Errorf("%d UDP sends for %d frames sent: no GSO batching", n, st.TxFrames)
	}
	if n := st.Events[EventTAPWrites]; n > st.RxFrames/2 {
		t.Errorf("%d TAP writes for %d frames received: no coalescing", n, st.RxFrames)
	}
}

// checkFastCounters checks a fast path node's counters after traffic both
// ways: the fast path carried nearly all frames it sent and, when the peer
// sends single datagrams (a kernel or fast path peer on this veth; a
// userspace peer's UDP GSO sends cross it as one skb each, which only the
// userspace path takes apart), nearly all it received.
func checkFastCounters(t *testing.T, st backend.Stats, rx bool) {
	t.Helper()
	t.Logf("fast path: %+v", st.Events)
	if st.Events[EventFastAttaches] != 1 {
		t.Errorf("fast path attached %d times, want 1", st.Events[EventFastAttaches])
	}
	if _, ok := st.Events[EventFastUnavailable]; ok {
		t.Errorf("a running fast path reports %s", EventFastUnavailable)
	}
	if n := st.Events[EventFastErrors]; n != 0 {
		t.Errorf("%d fast path errors", n)
	}
	fastTx, userTx := st.Events[EventFastTxFrames], st.TxFrames-st.Events[EventFastTxFrames]
	if fastTx == 0 || userTx > fastTx/100 {
		t.Errorf("frames sent: %d by the fast path, %d by the userspace path", fastTx, userTx)
	}
	if !rx {
		return
	}
	fastRx, userRx := st.Events[EventFastRxFrames], st.RxFrames-st.Events[EventFastRxFrames]
	if fastRx == 0 || userRx > fastRx/100 {
		t.Errorf("frames received: %d by the fast path, %d by the userspace path", fastRx, userRx)
	}
}

// udpExchange sends n UDP datagrams of varied sizes from the pod of a to the
// pod of b and checks that at least 90 % arrive intact (UDP may lose some
// under load; a checksum problem loses all).
func udpExchange(a, b *testNode, n int) error {
	var rc *net.UDPConn
	if err := b.pod.Do(func() (err error) {
		rc, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.podIP, 0)))
		return err
	}); err != nil {
		return err
	}
	defer rc.Close()
	var sc *net.UDPConn
	if err := a.pod.Do(func() (err error) {
		sc, err = net.DialUDP("udp", nil, rc.LocalAddr().(*net.UDPAddr))
		return err
	}); err != nil {
		return err
	}
	defer sc.Close()
	payload := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 1+(i*37)%1300) }
	go func() {
		for i := range n {
			sc.Write(payload(i))
			time.Sleep(time.Millisecond)
		}
	}()
	buf := make([]byte, 2000)
	got := 0
	rc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for got < n {
		m, err := rc.Read(buf)
		if err != nil {
			break
		}
		i := int(buf[0])
		if !bytes.Equal(buf[:m], payload(i)) && !bytes.Equal(buf[:m], payload(i+256)) {
			return fmt.Errorf("datagram of %d bytes corrupted", m)
		}
		got++
	}
	if got < n*9/10 {
		return fmt.Errorf("%d of %d datagrams arrived", got, n)
	}
	return nil
}
