package uvxlan

// The frames the fast path's unit tests hand its programs: an outer
// Ethernet, IPv4 and UDP header with a VXLAN header around an inner frame,
// each field settable to what a test needs wrong.

import (
	"encoding/binary"

	"github.com/weft-net/weft/subnet"
)

// testSum is the one's complement sum of b, folded and complemented: the
// IPv4 header checksum (0 over a header whose checksum is right).
func testSum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// ipv4Header returns a 20-byte IPv4 header for a payload of n bytes, its
// checksum filled in.
func ipv4Header(src, dst [4]byte, proto byte, id, frag uint16, n int) []byte {
	h := make([]byte, 20)
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(len(h)+n))
	binary.BigEndian.PutUint16(h[4:], id)
	binary.BigEndian.PutUint16(h[6:], frag)
	h[8], h[9] = 64, proto
	copy(h[12:], src[:])
	copy(h[16:], dst[:])
	binary.BigEndian.PutUint16(h[10:], testSum(h))
	return h
}

// fixOuterSum recomputes the checksum of the 20-byte outer IPv4 header of
// an untagged frame.
func fixOuterSum(b []byte) {
	binary.BigEndian.PutUint16(b[24:], 0)
	binary.BigEndian.PutUint16(b[24:], testSum(b[14:34]))
}

func ethHeader(dst, src [6]byte, typ uint16) []byte {
	h := append(append([]byte{}, dst[:]...), src[:]...)
	return binary.BigEndian.AppendUint16(h, typ)
}

// innerFrameFor returns an Ethernet frame with an IPv4 UDP packet from src
// to a local pod, of size bytes in all at the IPv4 layer.
func innerFrameFor(dst subnet.MAC, src [4]byte, size int) []byte {
	udp := make([]byte, size-20)
	binary.BigEndian.PutUint16(udp[0:], 5000)
	binary.BigEndian.PutUint16(udp[2:], 5001)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	for i := 8; i < len(udp); i++ {
		udp[i] = byte(i)
	}
	f := ethHeader(dst, bpfPeerMAC, etherTypeIPv4)
	f = append(f, ipv4Header(src, bpfPodLocal, 17, 1, 0, len(udp))...)
	return append(f, udp...)
}

// vxPacket describes a VXLAN packet to the local node, as the underlay
// device receives it; the zero value of each field (after defaults) is the
// packet the ingress program takes.
type vxPacket struct {
	outerDstMAC [6]byte // 00:…:00 is the test device's (loopback's) own: PACKET_HOST
	etherType   uint16
	vlan        bool
	frag        uint16
	proto       byte
	src, dst    [4]byte
	dport       uint16
	flags       [4]byte
	vni         uint32
	vniLow      byte // the reserved byte after the VNI
	inner       []byte
	udpLenDelta int
	ipLenDelta  int
	trailer     int
}

func defaultPacket() vxPacket {
	return vxPacket{etherType: etherTypeIPv4, proto: 17, src: bpfPeer, dst: bpfLocal, dport: 8472,
		flags: [4]byte{0x08}, vni: uint32(bpfParams.vni), inner: innerFrameFor(bpfMAC, bpfPodPeer, 100)}
}

func (p vxPacket) bytes() []byte {
	udpLen := udpHeaderLen + vxlanHeaderLen + len(p.inner)
	udp := make([]byte, udpHeaderLen+vxlanHeaderLen)
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], p.dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen+p.udpLenDelta))
	copy(udp[8:], p.flags[:])
	binary.BigEndian.PutUint32(udp[12:], p.vni<<8|uint32(p.vniLow))
	ip := ipv4Header(p.src, p.dst, p.proto, 0x1234, p.frag, udpLen+p.ipLenDelta)
	var b []byte
	if p.vlan {
		b = ethHeader(p.outerDstMAC, [6]byte{2, 0xbb, 0, 0, 0, 2}, 0x8100)
		b = binary.BigEndian.AppendUint16(b, 100)
		b = binary.BigEndian.AppendUint16(b, p.etherType)
	} else {
		b = ethHeader(p.outerDstMAC, [6]byte{2, 0xbb, 0, 0, 0, 2}, p.etherType)
	}
	b = append(b, ip...)
	b = append(b, udp...)
	b = append(b, p.inner...)
	return append(b, make([]byte, p.trailer)...)
}
