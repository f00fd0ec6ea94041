package tunpath

import "encoding/binary"

// completePartial completes the TCP or UDP checksum of the IP packet pkt
// (whose header check has passed) when its field holds exactly the
// pseudo-header sum, which is what a kernel VXLAN sender on a virtual link
// leaves for an offload that never runs (see "Partial checksums from
// kernel peers" in docs/uvxlan-design.md). A TAP write can ask the kernel
// to finish such a checksum; wireguard-go's tun Write cannot, so it is
// done here. A correct checksum that happens to equal the pseudo-header
// sum is written again unchanged. It reports whether it wrote one.
func completePartial(pkt []byte) bool {
	var (
		proto    byte
		src, dst []byte
		l4       []byte
	)
	switch pkt[0] >> 4 {
	case 4:
		if binary.BigEndian.Uint16(pkt[6:])&0x3fff != 0 { // a fragment
			return false
		}
		proto, src, dst, l4 = pkt[9], pkt[12:16], pkt[16:20], pkt[int(pkt[0]&0x0f)*4:]
	case 6:
		proto, src, dst, l4 = pkt[6], pkt[8:24], pkt[24:40], pkt[40:]
	default:
		return false
	}
	var at int
	switch {
	case proto == 6 && len(l4) >= 20:
		at = 16
	case proto == 17 && len(l4) >= 8:
		at = 6
	default:
		return false
	}
	ps := sum16(sum16(sum16(uint64(proto)+uint64(len(l4)), src), dst), nil)
	if binary.BigEndian.Uint16(l4[at:]) != fold(ps) {
		return false
	}
	l4[at], l4[at+1] = 0, 0
	c := ^fold(sum16(ps, l4))
	if c == 0 && proto == 17 {
		c = 0xffff // 0 means "no checksum" in UDP
	}
	binary.BigEndian.PutUint16(l4[at:], c)
	return true
}

// sum16 adds b as big-endian 16-bit words (an odd last byte padded with
// zero) to s, without folding.
func sum16(s uint64, b []byte) uint64 {
	for len(b) >= 2 {
		s += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint64(b[0]) << 8
	}
	return s
}

// fold folds s to 16 bits, ones' complement.
func fold(s uint64) uint16 {
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}
