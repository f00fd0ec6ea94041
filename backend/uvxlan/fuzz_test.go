package uvxlan

import (
	"bytes"
	"testing"
)

// FuzzDecode feeds arbitrary datagrams to the decoder and the coalescer:
// they must never panic, and whatever is accepted must satisfy the checks.
func FuzzDecode(f *testing.F) {
	f.Add(vxlanPacket(1, testMAC, 100))
	f.Add(vxlanPacket(2, testMAC, 0))
	f.Add(append(make([]byte, 8), ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK, 200)...))
	f.Add([]byte{0x08, 0, 0, 0, 0, 0, 1, 0})
	d := decoder{vni: 1, mac: testMAC, maxFrame: ethHeaderLen + 1450}
	c := newCoalescer(func(b []byte) error {
		if len(b) < virtioNetHdrLen+ethHeaderLen {
			panic("short write")
		}
		return nil
	})
	f.Fuzz(func(t *testing.T, pkt []byte) {
		if len(pkt) >= 8 {
			putVXLANHeader(pkt, 1) // reach the inner frame checks half the time
			if pkt[len(pkt)-1]&1 == 0 {
				pkt[0] ^= pkt[len(pkt)-1]
			}
		}
		frame, why := d.decode(pkt)
		if why != DropNone {
			return
		}
		if len(frame) < ethHeaderLen || len(frame) > d.maxFrame || !bytes.Equal(frame[:6], testMAC[:]) ||
			pkt[0] != 0x08 || pkt[6] != 1 || pkt[7] != 0 {
			t.Fatalf("accepted a bad packet % x", pkt[:min(len(pkt), 24)])
		}
		c.add(frame, l4Csum{})
		c.add(frame, l4Csum{})
		c.flush()
		flowHash(frame)
	})
}

// FuzzSegment feeds arbitrary frames and offload headers to the TSO
// segmenter, which reads what the kernel hands over from the TAP.
func FuzzSegment(f *testing.F) {
	frame := ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK, 3000)
	f.Add(frame, uint8(vnetGSOTCPv4), uint16(1386), uint16(34), uint16(16))
	f.Add(ipv6TCPFrame(testMAC, otherMAC, 1, tcpFlagACK, 3000), uint8(vnetGSOTCPv6), uint16(1366), uint16(54), uint16(16))
	out := make([]byte, 2*65550)
	f.Fuzz(func(t *testing.T, frame []byte, gso uint8, mss, start, off uint16) {
		if len(frame) > 65550 {
			return
		}
		h := vnetHdr{flags: vnetFlagNeedsCsum, gsoType: gso, gsoSize: mss, csumStart: start, csumOffset: off}
		stride, used, err := segmentTCP(frame, h, out)
		if err == nil && (stride <= 0 || used > len(out)) {
			t.Fatalf("stride %d used %d", stride, used)
		}
		completeChecksum(frame, int(start), int(off))
	})
}
