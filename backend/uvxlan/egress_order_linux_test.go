package uvxlan

import (
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/weft-net/weft/vtep"
)

// TestEgressKeepsOrder hands the egress path of one wake-up a TSO
// super-frame, a plain frame of the same flow and another super-frame, and
// checks on a loopback socket that the segments leave in sequence order:
// the run the first super-frame started must go before the plain frame,
// which must go before the second super-frame's segments.
func TestEgressKeepsOrder(t *testing.T) {
	rx, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	tx, err := listenUDP(netip.MustParseAddrPort("127.0.0.1:0"), roleSend, false)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.close()
	b := &Backend{dec: decoder{vni: 42}}
	lo := netip.MustParseAddr("127.0.0.1")
	b.peers.Store(newPeers(vtep.Table{netip.MustParsePrefix("10.244.2.0/24"): {MAC: testMAC, Addr: lo}},
		rx.LocalAddr().(*net.UDPAddr).Port, false))
	dp := &datapath{b: b, vnet: true, tx: []*udpSocket{tx}}
	sb := newSendBatch(egressOffloadBatch)
	sg := newSegmenter()
	sg.send = func(run runKey, nseg int) { dp.sendRun(sg, run, nseg) }

	const mss = 1398
	var want []uint32 // the sequence numbers of the segments, in order
	seq := uint32(1000)
	in := func(payload int, tso bool) []byte {
		f := ipv4TCPFrame(testMAC, otherMAC, seq, 1, tcpFlagACK, payload)
		var h vnetHdr
		if tso {
			h = tsoHeader(f, mss)
		}
		for off := 0; off < payload; off += mss {
			want = append(want, seq+uint32(off))
		}
		seq += uint32(payload)
		b := make([]byte, virtioNetHdrLen+len(f))
		h.encode(b)
		copy(b[virtioNetHdrLen:], f)
		return b
	}
	for _, frame := range [][]byte{in(3*mss, true), in(100, false), in(2*mss, true)} {
		dp.egressOffloaded(sb, sg, frame)
	}
	sg.flush()
	dp.flush(sb)

	var got []uint32
	buf := make([]byte, 2048)
	rx.SetReadDeadline(time.Now().Add(5 * time.Second))
	for len(got) < len(want) {
		n, err := rx.Read(buf)
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		if n < vxlanHeaderLen+ethHeaderLen+20+20 {
			t.Fatalf("datagram of %d bytes", n)
		}
		got = append(got, binary.BigEndian.Uint32(buf[vxlanHeaderLen+ethHeaderLen+20+4:]))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("segments left in the order %v, want %v", got, want)
	}
}
