package uvxlan

import (
	"encoding/binary"
	"net/netip"
)

// Inner frame checks on ingress, after the VXLAN header was accepted (see
// the package documentation). They are pure functions of the frame, so
// they are tested and fuzzed without a kernel.

// csumClass is what the L4 checksum of an inner frame turned out to be.
type csumClass uint8

const (
	csumNone    csumClass = iota // not TCP/UDP, a fragment, or behind IPv6 extension headers: the kernel checks it
	csumOK                       // complete and correct (or an IPv4 UDP datagram without checksum)
	csumPartial                  // exactly the pseudo-header sum a CHECKSUM_PARTIAL sender leaves
	csumBad                      // neither: corrupted
)

// innerIP is the IP layer of an inner frame, as far as ingress needs it.
type innerIP struct {
	src     netip.Addr
	proto   uint8
	l4      int  // offset of the L4 header from the start of the frame
	l4Len   int  // length of the L4 header and payload
	addrOff int  // offset of the source address (the destination follows)
	addrLen int  // 4 or 16
	fragged bool // an IPv4 fragment: no L4 checksum to check here
}

// IP protocol numbers and the UDP header length.
const (
	protoTCP     = 6
	protoUDP     = 17
	udpHeaderLen = 8
)

// parseInner checks that frame is an IPv4 or IPv6 packet in an Ethernet
// frame, with a consistent header, and returns its IP layer. Any other
// EtherType gives DropEtherType, a short or inconsistent header
// DropInnerMalformed.
func parseInner(frame []byte) (innerIP, DropReason) {
	var ip innerIP
	if len(frame) < ethHeaderLen {
		return ip, DropInnerMalformed
	}
	p := frame[ethHeaderLen:]
	switch binary.BigEndian.Uint16(frame[12:14]) {
	case etherTypeIPv4:
		if len(p) < ipv4HeaderLenMin || p[0]>>4 != 4 {
			return ip, DropInnerMalformed
		}
		ihl := int(p[0]&0x0f) * 4
		total := int(binary.BigEndian.Uint16(p[2:4]))
		if ihl < ipv4HeaderLenMin || total < ihl || total > len(p) {
			return ip, DropInnerMalformed
		}
		ip.src = netip.AddrFrom4([4]byte(p[12:16]))
		ip.proto, ip.addrOff, ip.addrLen = p[9], ethHeaderLen+12, 4
		ip.fragged = binary.BigEndian.Uint16(p[6:8])&0x3fff != 0
		ip.l4, ip.l4Len = ethHeaderLen+ihl, total-ihl
	case etherTypeIPv6:
		if len(p) < ipv6HeaderLen || p[0]>>4 != 6 {
			return ip, DropInnerMalformed
		}
		payload := int(binary.BigEndian.Uint16(p[4:6]))
		if ipv6HeaderLen+payload > len(p) {
			return ip, DropInnerMalformed
		}
		ip.src = netip.AddrFrom16([16]byte(p[8:24]))
		ip.proto, ip.addrOff, ip.addrLen = p[6], ethHeaderLen+8, 16
		ip.l4, ip.l4Len = ethHeaderLen+ipv6HeaderLen, payload
	default:
		return ip, DropEtherType
	}
	return ip, DropNone
}

// checksumOffset returns where a TCP or UDP header keeps its checksum, or 0
// for a protocol whose checksum is not checked here.
func checksumOffset(proto uint8, l4Len int) int {
	switch {
	case proto == protoTCP && l4Len >= tcpHeaderLenMin:
		return 16
	case proto == protoUDP && l4Len >= udpHeaderLen:
		return 6
	}
	return 0
}

// classifyChecksum checks the TCP or UDP checksum of the packet described
// by ip. It returns the class and, for a partial checksum, the l4Csum that
// marks it for completion by the receiver.
//
// A CHECKSUM_PARTIAL sender (a kernel VXLAN device on a veth or another
// virtual link that carries checksum offload through) leaves in the field
// the folded pseudo-header sum of source, destination, protocol and L4
// length, not complemented, for an offload that never runs. That value is
// recognised exactly; a corruption that happens to produce it passes with
// odds of about 1 in 65,536 per corrupted frame, the same as a corruption
// that happens to keep a complete checksum valid.
func classifyChecksum(frame []byte, ip innerIP) (csumClass, l4Csum) {
	if ip.l4 == 0 || ip.fragged {
		return csumNone, l4Csum{}
	}
	off := checksumOffset(ip.proto, ip.l4Len)
	if off == 0 {
		return csumNone, l4Csum{}
	}
	l4 := frame[ip.l4 : ip.l4+ip.l4Len]
	field := binary.BigEndian.Uint16(l4[off:])
	if ip.proto == protoUDP && field == 0 {
		if ip.addrLen == 4 {
			return csumOK, l4Csum{} // IPv4 UDP without a checksum
		}
		return csumBad, l4Csum{} // IPv6 requires one
	}
	pseudo := checksumAdd(frame[ip.addrOff:ip.addrOff+2*ip.addrLen], uint64(ip.proto)+uint64(ip.l4Len))
	if checksumFold(checksumAdd(l4, pseudo)) == 0xffff {
		return csumOK, l4Csum{}
	}
	if field == checksumFold(pseudo) {
		return csumPartial, l4Csum{start: uint16(ip.l4), offset: uint16(off)}
	}
	return csumBad, l4Csum{}
}

// completePartial writes the complete checksum into a frame whose checksum
// was classified partial (cs), for a TAP that cannot take the mark.
func completePartial(frame []byte, ip innerIP, cs l4Csum) {
	l4 := frame[cs.start : int(cs.start)+ip.l4Len]
	at := l4[cs.offset:]
	// The field holds the pseudo-header sum: the sum of the segment as it
	// is, field included, is exactly what the checksum covers.
	c := ^checksumFold(checksumAdd(l4, 0))
	if c == 0 && ip.proto == protoUDP {
		c = 0xffff // 0 means "no checksum" in UDP
	}
	binary.BigEndian.PutUint16(at, c)
}

// checkInnerFrame checks an inner frame from a peer whose subnets are
// given: IPv4 or IPv6 only, a consistent IP header, a source inside the
// peer's subnets (unless allowForeign), and a TCP/UDP checksum that is
// correct or partial. It returns the IP layer, the checksum class and mark,
// or the reason to drop the frame.
func checkInnerFrame(frame []byte, subnets []netip.Prefix, allowForeign bool) (innerIP, csumClass, l4Csum, DropReason) {
	ip, why := parseInner(frame)
	if why != DropNone {
		return ip, csumNone, l4Csum{}, why
	}
	if !allowForeign && !allowedSource(ip.src, subnets) {
		return ip, csumNone, l4Csum{}, DropForeignSource
	}
	class, cs := classifyChecksum(frame, ip)
	if class == csumBad {
		return ip, class, l4Csum{}, DropBadChecksum
	}
	return ip, class, cs, DropNone
}

// allowedSource reports whether src lies in one of the sender's subnets.
func allowedSource(src netip.Addr, subnets []netip.Prefix) bool {
	for _, p := range subnets {
		if p.Contains(src) {
			return true
		}
	}
	return false
}
