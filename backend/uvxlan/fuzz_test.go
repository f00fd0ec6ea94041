package uvxlan

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
)

// FuzzDecode feeds arbitrary datagrams through the ingress checks (VXLAN
// header, inner frame, checksum) and the coalescer. Whatever is accepted
// must satisfy the checks, and no frame whose checksum is corrupted is ever
// delivered as valid or as partial: that is judged by the tests' own
// checksum code (refSum), not the package's.
func FuzzDecode(f *testing.F) {
	f.Add(vxlanPacket(1, testMAC, 100))
	f.Add(vxlanPacket(2, testMAC, 0))
	f.Add(append(make([]byte, 8), ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK, 200)...))
	f.Add([]byte{0x08, 0, 0, 0, 0, 0, 1, 0})
	for _, st := range []int{stateValid, statePartial, stateCorrupt} {
		f.Add(encap(1, innerFrame(innerSrc4, innerDst4, protoTCP, 300, st)))
		f.Add(encap(1, innerFrame(innerSrc6, innerDst6, protoUDP, 301, st)))
		f.Add(encap(1, innerFrame(innerSrc4, innerDst4, protoTCP, 3000, st)))
	}
	peer := []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:10:244:2::/64")}
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
		if d.tunnelGSO(pkt) {
			frame, why = d.decodeAnySize(pkt)
		}
		if why != DropNone {
			return
		}
		if len(frame) < ethHeaderLen || !bytes.Equal(frame[:6], testMAC[:]) || pkt[0] != 0x08 || pkt[6] != 1 || pkt[7] != 0 {
			t.Fatalf("accepted a bad packet % x", pkt[:min(len(pkt), 24)])
		}
		ip, class, cs, why := checkInnerFrame(frame, peer, false)
		if why != DropNone {
			return
		}
		if !allowedSource(ip.src, peer) {
			t.Fatalf("accepted foreign source %s", ip.src)
		}
		checkClass(t, frame, ip, class)
		if len(frame) <= d.maxFrame {
			c.add(frame, cs)
			c.add(frame, cs)
			c.flush()
		}
		flowHash(frame)
	})
}

// checkClass verifies a checksum class against the tests' own checksum.
func checkClass(t *testing.T, frame []byte, ip innerIP, class csumClass) {
	t.Helper()
	if class == csumNone || class == csumBad {
		return
	}
	l4 := frame[ip.l4 : ip.l4+ip.l4Len]
	off := 16
	if ip.proto == protoUDP {
		off = 6
	}
	field := binary.BigEndian.Uint16(l4[off:])
	var src, dst netip.Addr
	if ip.addrLen == 4 {
		src, dst = netip.AddrFrom4([4]byte(frame[ip.addrOff:])), netip.AddrFrom4([4]byte(frame[ip.addrOff+4:]))
	} else {
		src, dst = netip.AddrFrom16([16]byte(frame[ip.addrOff:])), netip.AddrFrom16([16]byte(frame[ip.addrOff+16:]))
	}
	p := refPseudo(src, dst, ip.proto, ip.l4Len)
	switch {
	case class == csumPartial && field != p:
		t.Fatalf("partial checksum %#04x is not the pseudo-header sum %#04x", field, p)
	case class == csumOK && ip.proto == protoUDP && ip.addrLen == 4 && field == 0:
	case class == csumOK && refSum([]byte{byte(p >> 8), byte(p)}, l4) != 0xffff:
		t.Fatalf("corrupted checksum %#04x delivered as valid", field)
	}
}

// FuzzSegment feeds arbitrary frames and offload headers to the TSO
// segmenter, which reads what the kernel hands over from the TAP. Whatever it
// accepts must round-trip: the segments' payloads reassemble to the input
// payload, each segment carries the input's headers with its own sequence
// number and lengths, and its IPv4 header and TCP checksums verify with
// refSum, a plain checksum written for this test.
func FuzzSegment(f *testing.F) {
	frame := ipv4TCPFrame(testMAC, otherMAC, 1, 1, tcpFlagACK, 3000)
	f.Add(frame, uint8(vnetGSOTCPv4), uint16(1386), uint16(34), uint16(16))
	f.Add(ipv6TCPFrame(testMAC, otherMAC, 1, tcpFlagACK, 3000), uint8(vnetGSOTCPv6), uint16(1366), uint16(54), uint16(16))
	f.Add(ipv4TCPFrame(testMAC, otherMAC, 1<<32-100, 7, tcpFlagACK|tcpFlagPSH|tcpFlagFIN, 5), uint8(vnetGSOTCPv4), uint16(2), uint16(34), uint16(16))
	out := make([]byte, 2*65550)
	f.Fuzz(func(t *testing.T, frame []byte, gso uint8, mss, start, off uint16) {
		if len(frame) > 65550 {
			return
		}
		in := append([]byte(nil), frame...)
		h := vnetHdr{flags: vnetFlagNeedsCsum, gsoType: gso, gsoSize: mss, csumStart: start, csumOffset: off}
		stride, used, err := segmentTCP(frame, h, out)
		if !bytes.Equal(in, frame) {
			t.Fatal("segmentTCP changed its input")
		}
		if err == nil {
			checkSegments(t, in, int(start), int(mss), out[:used], stride)
		}
		completeChecksum(frame, int(start), int(off))
	})
}

// checkSegments checks the segments of super-frame in (TCP header at
// tcpOff) against it.
func checkSegments(t *testing.T, in []byte, tcpOff, mss int, out []byte, stride int) {
	t.Helper()
	hdrLen := tcpOff + int(in[tcpOff+12]>>4)*4
	payload := in[hdrLen:]
	v6 := binary.BigEndian.Uint16(in[12:]) == 0x86dd
	if !v6 && int(in[14]&0x0f)*4 < ipv4HeaderLenMin {
		t.Fatalf("segmented a frame whose IPv4 header length is %d bytes", int(in[14]&0x0f)*4)
	}
	var got []byte
	for i := 0; len(out) > 0; i++ {
		n := min(stride, len(out))
		seg := out[vxlanHeaderLen:n]
		out = out[n:]
		if len(seg) < hdrLen || len(seg) > hdrLen+mss {
			t.Fatalf("segment %d: %d bytes with %d of headers, MSS %d", i, len(seg), hdrLen, mss)
		}
		got = append(got, seg[hdrLen:]...)
		tcp := seg[tcpOff:]
		if want := binary.BigEndian.Uint32(in[tcpOff+4:]) + uint32(i*mss); binary.BigEndian.Uint32(tcp[4:]) != want {
			t.Fatalf("segment %d: seq %d, want %d", i, binary.BigEndian.Uint32(tcp[4:]), want)
		}
		var pseudo []byte
		if v6 {
			if pl := int(binary.BigEndian.Uint16(seg[18:])); pl != len(seg)-54 {
				t.Fatalf("segment %d: IPv6 payload length %d, want %d", i, pl, len(seg)-54)
			}
			pseudo = append(pseudo, seg[22:54]...)
		} else {
			ihl := int(seg[14]&0x0f) * 4
			if tl := int(binary.BigEndian.Uint16(seg[16:])); tl != len(seg)-14 {
				t.Fatalf("segment %d: IPv4 total length %d, want %d", i, tl, len(seg)-14)
			}
			if s := refSum(seg[14 : 14+ihl]); s != 0xffff {
				t.Fatalf("segment %d: IPv4 header checksum does not verify (sum %#x)", i, s)
			}
			pseudo = append(pseudo, seg[26:34]...)
		}
		pseudo = append(pseudo, 0, 6, byte(len(tcp)>>8), byte(len(tcp)))
		if s := refSum(append(pseudo, tcp...)); s != 0xffff {
			t.Fatalf("segment %d: TCP checksum does not verify (sum %#x)", i, s)
		}
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("segments carry %d payload bytes that differ from the %d of the input", len(got), len(payload))
	}
}
