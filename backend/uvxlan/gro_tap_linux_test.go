package uvxlan

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
)

// tapPeer is a TCP sender in userspace that talks to the kernel through a
// real TAP (with virtio-net headers and offloads) in a test namespace,
// every frame passing through the coalescer: what the kernel accepts is
// the proof that the headers the coalescer writes are right.
type tapPeer struct {
	t    *testing.T
	ns   *nettest.NS
	tap  *os.File
	c    *coalescer
	f    *oFlow
	addr netip.Addr // the kernel's address
	gso  int        // super-frames written
}

func newTapPeer(t *testing.T, v6 bool) *tapPeer {
	n := nettest.NewNS(t, "gro")
	var tap *os.File
	if err := n.Do(func() (err error) { tap, err = openVnetTAP("wgro0", false); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tap.Close() })
	p := &tapPeer{t: t, ns: n, tap: tap, f: newOFlow(newORand(1, nil), 0)}
	p.f.v6, p.f.ts, p.f.df, p.f.win, p.f.ttl, p.f.tos = v6, 0, true, 65535, 64, 0
	p.f.mac = [6]byte{0x02, 0x11, 0, 0, 0, 2}
	mac := net.HardwareAddr(p.f.mac[:]).String()
	nettest.MustRun(t, n, "ip", "link", "set", "wgro0", "address", net.HardwareAddr(oDstMAC[:]).String(), "mtu", "1500", "up")
	if v6 {
		p.addr = netip.MustParseAddr("fd99::1")
		nettest.MustRun(t, n, "ip", "addr", "add", "fd99::1/64", "dev", "wgro0", "nodad")
		nettest.MustRun(t, n, "ip", "neigh", "add", "fd99::2", "lladdr", mac, "dev", "wgro0", "nud", "permanent")
		p.f.src, p.f.dst = netip.MustParseAddr("fd99::2").AsSlice(), p.addr.AsSlice()
	} else {
		p.addr = netip.MustParseAddr("10.99.0.1")
		nettest.MustRun(t, n, "ip", "addr", "add", "10.99.0.1/24", "dev", "wgro0")
		nettest.MustRun(t, n, "ip", "neigh", "add", "10.99.0.2", "lladdr", mac, "dev", "wgro0", "nud", "permanent")
		p.f.src, p.f.dst = netip.MustParseAddr("10.99.0.2").AsSlice(), p.addr.AsSlice()
	}
	// The datapath's writer: each frame gathered from its pieces in one
	// writev, as the ingress loop writes it.
	rc, err := tap.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	g := newTAPGather()
	p.c = newGatherCoalescer(func(iov [][]byte) error {
		if iov[0][1] != vnetGSONone {
			p.gso++
		}
		g.n = 0
		for _, b := range iov {
			g.iovs[g.n].Base, g.n = &b[0], g.n+1
			g.iovs[g.n-1].SetLen(len(b))
		}
		if err := rc.Write(g.fn); err != nil {
			return err
		}
		return g.err
	})
	return p
}

// send hands frames to the coalescer as one receive batch.
func (p *tapPeer) send(frames ...oSent) {
	p.t.Helper()
	for _, s := range frames {
		if err := p.c.add(s.frame, s.cs); err != nil {
			p.t.Fatal(err)
		}
	}
	if err := p.c.flush(); err != nil {
		p.t.Fatal(err)
	}
}

// seg builds the flow's next segment and advances its sequence number.
func (p *tapPeer) seg(flags uint8, n int, partial bool) oSent {
	fr, cs := p.f.build(oSpec{seq: p.f.seq, flags: flags, payload: n, partial: partial})
	p.f.seq += uint32(n)
	if flags&(tcpFlagSYN|tcpFlagFIN) != 0 {
		p.f.seq++
	}
	return oSent{fr, cs}
}

// handshake connects to a listener on the kernel side and returns the
// accepted connection.
func (p *tapPeer) handshake(ln net.Listener) net.Conn {
	p.t.Helper()
	p.f.seq = 1000
	p.send(p.seg(tcpFlagSYN, 0, true))
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 1<<16)
	for {
		p.tap.SetReadDeadline(deadline)
		n, err := p.tap.Read(buf)
		if err != nil {
			p.t.Fatalf("waiting for the syn-ack: %v", err)
		}
		q := oParse(buf[virtioNetHdrLen:n])
		if !q.nonTCP && !q.broken && q.dport == p.f.sport && q.flags == tcpFlagSYN|tcpFlagACK {
			p.f.ack = q.seq + 1
			break
		}
	}
	p.send(p.seg(tcpFlagACK, 0, false))
	conn, err := ln.Accept()
	if err != nil {
		p.t.Fatal(err)
	}
	return conn
}

// csumErrors reads the kernel's count of TCP segments dropped for a bad
// checksum.
func (p *tapPeer) csumErrors() int {
	p.t.Helper()
	out := nettest.MustRun(p.t, p.ns, "cat", "/proc/net/snmp") // TCP's counters serve both families
	var names []string
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 || fields[0] != "Tcp:" {
			continue
		}
		if names == nil {
			names = fields
			continue
		}
		for i, name := range names {
			if name == "InCsumErrors" && i < len(fields) {
				v, _ := strconv.Atoi(fields[i])
				return v
			}
		}
	}
	p.t.Fatalf("no InCsumErrors in /proc/net/snmp")
	return 0
}

// partialAsComplete sends a segment whose field holds only the
// pseudo-header sum but whose header says it is complete: the kernel must
// count a checksum error (and drop it). The flow's sequence number stays.
func (p *tapPeer) partialAsComplete() {
	p.t.Helper()
	before := p.csumErrors()
	bad := p.seg(tcpFlagACK, 1000, true)
	p.f.seq -= 1000
	p.send(oSent{frame: bad.frame})
	deadline := time.Now().Add(10 * time.Second)
	for p.csumErrors() == before {
		if time.Now().After(deadline) {
			p.t.Fatal("the kernel did not count a checksum error for a partial checksum written as complete")
		}
		time.Sleep(10 * time.Millisecond) // polling a kernel counter
	}
}

// TestCoalescerIntoKernel sends a TCP stream through the coalescer into a
// real TAP: merged runs of complete and partial checksums, reordered
// segments merged by prepending, a data-less ACK and PSH in the middle and
// a FIN with a partial checksum at the end. The kernel's socket must read
// exactly the stream; a segment with only the pseudo-header sum but
// written as complete must be dropped by the kernel as a checksum error.
func TestCoalescerIntoKernel(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(fmt.Sprintf("ipv6=%v", v6), func(t *testing.T) {
			p := newTapPeer(t, v6)
			var ln net.Listener
			if err := p.ns.Do(func() (err error) {
				ln, err = net.Listen("tcp", netip.AddrPortFrom(p.addr, p.f.dport).String())
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			conn := p.handshake(ln)
			defer conn.Close()
			start := p.f.seq

			p.partialAsComplete()

			const segs = 48
			for b := 0; b < segs/8; b++ {
				batch := make([]oSent, 0, 9)
				for i := range 8 {
					flags := uint8(tcpFlagACK)
					if b == 3 && i == 3 {
						flags |= tcpFlagPSH
					}
					batch = append(batch, p.seg(flags, 1000, (b+i)%2 == 0))
				}
				if b%2 == 1 {
					batch[0], batch[1] = batch[1], batch[0] // prepended
				}
				if b == 2 {
					batch = append(batch[:5], append([]oSent{p.seg(tcpFlagACK, 0, true)}, batch[5:]...)...)
				}
				p.send(batch...)
			}
			p.send(p.seg(tcpFlagACK, 1000, true)) // a run of one, partial
			p.send(p.seg(tcpFlagACK, 1000, false), p.seg(tcpFlagACK, 1000, true), p.seg(tcpFlagACK|tcpFlagFIN, 0, true))

			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			got, err := io.ReadAll(conn)
			if err != nil {
				t.Fatalf("read %d bytes, then: %v", len(got), err)
			}
			want := make([]byte, (segs+3)*1000)
			for i := range want {
				want[i] = oPayload(0, start+uint32(i))
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("the kernel's socket read %d bytes, not the %d sent", len(got), len(want))
			}
			if p.gso < segs/8 {
				t.Fatalf("%d super-frames written, want at least %d", p.gso, segs/8)
			}
		})
	}
}
