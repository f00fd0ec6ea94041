package uvxlan

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
)

// The inner frame tests build their frames and checksums with refSum,
// a plain RFC 1071 sum written for the tests, never with the package's own
// checksum code.

// refSum is the one's-complement sum of b as big-endian 16-bit words,
// folded to 16 bits (not complemented).
func refSum(parts ...[]byte) uint16 {
	var s uint32
	for _, b := range parts {
		for i := 0; i+1 < len(b); i += 2 {
			s += uint32(b[i])<<8 | uint32(b[i+1])
		}
		if len(b)%2 == 1 {
			s += uint32(b[len(b)-1]) << 8
		}
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}

// refPseudo is the pseudo-header sum of an IP packet's L4 part.
func refPseudo(src, dst netip.Addr, proto uint8, l4Len int) uint16 {
	var tail [4]byte
	binary.BigEndian.PutUint16(tail[0:], uint16(proto))
	binary.BigEndian.PutUint16(tail[2:], uint16(l4Len))
	return refSum(src.AsSlice(), dst.AsSlice(), tail[:])
}

// Checksum states a test frame can be built with.
const (
	stateValid = iota
	statePartial
	stateCorrupt
)

var (
	innerSrc4 = netip.MustParseAddr("10.244.2.5")
	innerDst4 = netip.MustParseAddr("10.244.1.2")
	innerSrc6 = netip.MustParseAddr("fd00:10:244:2::5")
	innerDst6 = netip.MustParseAddr("fd00:10:244:1::2")
)

// innerFrame builds an Ethernet frame with an IPv4 or IPv6 packet from src
// to dst carrying a TCP (20-byte header) or UDP header and payload bytes,
// its L4 checksum in the given state.
func innerFrame(src, dst netip.Addr, proto uint8, payload, state int) []byte {
	l4Len := udpHeaderLen + payload
	if proto == protoTCP {
		l4Len = tcpHeaderLenMin + payload
	}
	ipLen := ipv4HeaderLenMin
	if src.Is6() {
		ipLen = ipv6HeaderLen
	}
	f := make([]byte, ethHeaderLen+ipLen+l4Len)
	copy(f, testMAC[:])
	copy(f[6:], otherMAC[:])
	ip := f[ethHeaderLen:]
	if src.Is6() {
		binary.BigEndian.PutUint16(f[12:], etherTypeIPv6)
		ip[0], ip[6], ip[7] = 0x60, proto, 64
		binary.BigEndian.PutUint16(ip[4:], uint16(l4Len))
		copy(ip[8:], src.AsSlice())
		copy(ip[24:], dst.AsSlice())
	} else {
		binary.BigEndian.PutUint16(f[12:], etherTypeIPv4)
		ip[0], ip[8], ip[9] = 0x45, 64, proto
		binary.BigEndian.PutUint16(ip[2:], uint16(ipLen+l4Len))
		copy(ip[12:], src.AsSlice())
		copy(ip[16:], dst.AsSlice())
		binary.BigEndian.PutUint16(ip[10:], ^refSum(ip[:20]))
	}
	l4 := ip[ipLen:]
	binary.BigEndian.PutUint16(l4[0:], 40000)
	binary.BigEndian.PutUint16(l4[2:], 5201)
	off := 6
	if proto == protoTCP {
		off = 16
		l4[12], l4[13] = 5<<4, tcpFlagACK
	} else {
		binary.BigEndian.PutUint16(l4[4:], uint16(l4Len))
	}
	hdr := l4Len - payload
	for i := hdr; i < l4Len; i++ {
		l4[i] = byte(i * 7)
	}
	pseudo := refPseudo(src, dst, proto, l4Len)
	switch state {
	case statePartial:
		binary.BigEndian.PutUint16(l4[off:], pseudo)
	default:
		c := ^refSum([]byte{byte(pseudo >> 8), byte(pseudo)}, l4)
		if c == 0 && proto == protoUDP {
			c = 0xffff
		}
		binary.BigEndian.PutUint16(l4[off:], c)
		if state == stateCorrupt {
			l4[len(l4)-1] ^= 0x10
		}
	}
	return f
}

// refValid reports whether the L4 checksum of an IPv4/IPv6 test frame is
// complete and correct.
func refValid(f []byte) bool {
	var src, dst netip.Addr
	var proto uint8
	var l4 []byte
	if binary.BigEndian.Uint16(f[12:]) == etherTypeIPv6 {
		ip := f[ethHeaderLen:]
		src, dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
		proto, l4 = ip[6], ip[40:40+int(binary.BigEndian.Uint16(ip[4:]))]
	} else {
		ip := f[ethHeaderLen:]
		ihl := int(ip[0]&15) * 4
		src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		proto, l4 = ip[9], ip[ihl:int(binary.BigEndian.Uint16(ip[2:]))]
	}
	p := refPseudo(src, dst, proto, len(l4))
	return refSum([]byte{byte(p >> 8), byte(p)}, l4) == 0xffff
}

func TestClassifyChecksum(t *testing.T) {
	peer := []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:10:244:2::/64")}
	for _, fam := range []struct {
		name     string
		src, dst netip.Addr
		l4       uint16
	}{{"ipv4", innerSrc4, innerDst4, 34}, {"ipv6", innerSrc6, innerDst6, 54}} {
		for _, proto := range []struct {
			name string
			p    uint8
			off  uint16
		}{{"tcp", protoTCP, 16}, {"udp", protoUDP, 6}} {
			for _, st := range []struct {
				name      string
				state     int
				class     csumClass
				why       DropReason
				wantMark  bool
				payload   int
				delivered string
			}{
				{"correct", stateValid, csumOK, DropNone, false, 1000, "delivered"},
				{"correct-odd", stateValid, csumOK, DropNone, false, 333, "delivered"},
				{"partial", statePartial, csumPartial, DropNone, true, 1000, "delivered and marked"},
				{"partial-empty", statePartial, csumPartial, DropNone, true, 0, "delivered and marked"},
				{"corrupted", stateCorrupt, csumBad, DropBadChecksum, false, 1000, "dropped"},
			} {
				t.Run(fmt.Sprintf("%s/%s/%s", fam.name, proto.name, st.name), func(t *testing.T) {
					f := innerFrame(fam.src, fam.dst, proto.p, st.payload, st.state)
					if st.state == stateCorrupt && st.payload == 0 {
						t.Skip("nothing to corrupt")
					}
					_, class, cs, why := checkInnerFrame(f, peer, false)
					if class != st.class || why != st.why {
						t.Fatalf("class %d, drop %s; want class %d, drop %s (%s)", class, why, st.class, st.why, st.delivered)
					}
					want := l4Csum{}
					if st.wantMark {
						want = l4Csum{start: fam.l4, offset: proto.off}
					}
					if cs != want {
						t.Fatalf("mark %+v, want %+v", cs, want)
					}
				})
			}
		}
	}
}

func TestCompletePartial(t *testing.T) {
	peer := []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:10:244:2::/64")}
	for _, src := range []netip.Addr{innerSrc4, innerSrc6} {
		dst := innerDst4
		if src.Is6() {
			dst = innerDst6
		}
		for _, p := range []uint8{protoTCP, protoUDP} {
			for _, size := range []int{0, 1, 2, 999, 1400} {
				f := innerFrame(src, dst, p, size, statePartial)
				ip, class, cs, why := checkInnerFrame(f, peer, false)
				if class != csumPartial || why != DropNone {
					t.Fatalf("%s proto %d size %d: class %d drop %s", src, p, size, class, why)
				}
				if refValid(f) {
					t.Fatalf("%s proto %d size %d: partial frame already valid", src, p, size)
				}
				completePartial(f, ip, cs)
				if !refValid(f) {
					t.Errorf("%s proto %d size %d: completed checksum is wrong", src, p, size)
				}
				if _, class, _, _ := checkInnerFrame(f, peer, false); class != csumOK {
					t.Errorf("%s proto %d size %d: completed frame classified %d", src, p, size, class)
				}
			}
		}
	}
}

func TestCheckInnerFrame(t *testing.T) {
	peer := []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:10:244:2::/64")}
	foreign4 := innerFrame(netip.MustParseAddr("10.244.9.5"), innerDst4, protoTCP, 100, stateValid)
	foreign6 := innerFrame(netip.MustParseAddr("fd00:10:244:9::5"), innerDst6, protoUDP, 100, stateValid)
	arp := make([]byte, 42)
	binary.BigEndian.PutUint16(arp[12:], 0x0806)
	vlan := innerFrame(innerSrc4, innerDst4, protoTCP, 10, stateValid)
	binary.BigEndian.PutUint16(vlan[12:], 0x8100)
	icmp := innerFrame(innerSrc4, innerDst4, 1, 0, stateValid)
	frag := innerFrame(innerSrc4, innerDst4, protoUDP, 100, stateCorrupt)
	frag[ethHeaderLen+6] = 0x20 // more fragments: no checksum to check here
	udpZero4 := innerFrame(innerSrc4, innerDst4, protoUDP, 100, stateValid)
	udpZero4[ethHeaderLen+20+6], udpZero4[ethHeaderLen+20+7] = 0, 0
	udpZero6 := innerFrame(innerSrc6, innerDst6, protoUDP, 100, stateValid)
	udpZero6[ethHeaderLen+40+6], udpZero6[ethHeaderLen+40+7] = 0, 0
	shortIP := innerFrame(innerSrc4, innerDst4, protoTCP, 10, stateValid)[:ethHeaderLen+19]
	longLen := innerFrame(innerSrc4, innerDst4, protoTCP, 10, stateValid)
	binary.BigEndian.PutUint16(longLen[ethHeaderLen+2:], 2000)
	badIHL := innerFrame(innerSrc4, innerDst4, protoTCP, 10, stateValid)
	badIHL[ethHeaderLen] = 0x44
	wrongVersion := innerFrame(innerSrc6, innerDst6, protoTCP, 10, stateValid)
	wrongVersion[ethHeaderLen] = 0x40
	padded := append(innerFrame(innerSrc4, innerDst4, protoTCP, 0, stateValid), 0, 0, 0, 0, 0, 0)
	for _, tc := range []struct {
		name         string
		frame        []byte
		allowForeign bool
		why          DropReason
		class        csumClass
	}{
		{"foreign ipv4 source", foreign4, false, DropForeignSource, csumNone},
		{"foreign ipv6 source", foreign6, false, DropForeignSource, csumNone},
		{"foreign source allowed", foreign4, true, DropNone, csumOK},
		{"arp", arp, false, DropEtherType, csumNone},
		{"vlan tag", vlan, false, DropEtherType, csumNone},
		{"icmp is the kernel's to check", icmp, false, DropNone, csumNone},
		{"ipv4 fragment", frag, false, DropNone, csumNone},
		{"ipv4 udp without checksum", udpZero4, false, DropNone, csumOK},
		{"ipv6 udp without checksum", udpZero6, false, DropBadChecksum, csumBad},
		{"short ipv4 header", shortIP, false, DropInnerMalformed, csumNone},
		{"ipv4 length beyond the frame", longLen, false, DropInnerMalformed, csumNone},
		{"ipv4 header length below 20", badIHL, false, DropInnerMalformed, csumNone},
		{"ipv6 ethertype, version 4", wrongVersion, false, DropInnerMalformed, csumNone},
		{"ethernet padding after the packet", padded, false, DropNone, csumOK},
		{"no ip header", make([]byte, ethHeaderLen), false, DropEtherType, csumNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, class, _, why := checkInnerFrame(tc.frame, peer, tc.allowForeign)
			if why != tc.why || class != tc.class {
				t.Errorf("drop %s class %d, want drop %s class %d", why, class, tc.why, tc.class)
			}
		})
	}
}

func TestTunnelGSO(t *testing.T) {
	d := decoder{vni: 1, mac: testMAC, maxFrame: ethHeaderLen + 1450}
	super4 := encap(1, innerFrame(innerSrc4, innerDst4, protoTCP, 20000, statePartial))
	super6 := encap(1, innerFrame(innerSrc6, innerDst6, protoTCP, 20000, statePartial))
	small := encap(1, innerFrame(innerSrc4, innerDst4, protoTCP, 1000, statePartial))
	// UDP GRO output: full-size datagrams back to back.
	one := encap(1, innerFrame(innerSrc4, innerDst4, protoTCP, 1410, stateValid))
	var gro []byte
	for range 5 {
		gro = append(gro, one...)
	}
	short := append([]byte(nil), super4...)
	binary.BigEndian.PutUint16(short[vxlanHeaderLen+ethHeaderLen+2:], 1000)
	for _, tc := range []struct {
		name string
		pkt  []byte
		want bool
	}{
		{"ipv4 super-packet", super4, true},
		{"ipv6 super-packet", super6, true},
		{"one datagram", small, false},
		{"one full-size datagram", one, false},
		{"udp gro batch", gro, false},
		{"inner length does not span", short, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := d.tunnelGSO(tc.pkt); got != tc.want {
				t.Errorf("tunnelGSO = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSuperHeader(t *testing.T) {
	for _, tc := range []struct {
		name     string
		src, dst netip.Addr
		mtu, seg int // the pods' MTU, the sender's segment size (0: not reported)
		gso      uint8
		mss, n   int
		start    uint16
	}{
		{"ipv4 sender's mss", innerSrc4, innerDst4, 1450, 1398, vnetGSOTCPv4, 1398, 15, 34},
		{"ipv4 no mss reported", innerSrc4, innerDst4, 1450, 0, vnetGSOTCPv4, 1410, 15, 34},
		{"ipv4 mss too big for the mtu", innerSrc4, innerDst4, 1450, 9000, vnetGSOTCPv4, 1410, 15, 34},
		{"ipv6", innerSrc6, innerDst6, 1450, 1378, vnetGSOTCPv6, 1378, 15, 54},
		// a dual-stack node's pods have the IPv6 overlay's MTU, 20 below
		// the IPv4 TAP's: segments must fit it, not the TAP's
		{"ipv4 no mss reported, dual-stack pods", innerSrc4, innerDst4, 1430, 0, vnetGSOTCPv4, 1390, 15, 34},
		{"ipv4 mss too big for dual-stack pods", innerSrc4, innerDst4, 1430, 1398, vnetGSOTCPv4, 1390, 15, 34},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := innerFrame(tc.src, tc.dst, protoTCP, 20000, stateValid)
			ip, why := parseInner(f)
			if why != DropNone {
				t.Fatal(why)
			}
			h, n, ok := superHeader(f, ip, tc.mtu, tc.seg)
			if !ok || h.gsoType != tc.gso || int(h.gsoSize) != tc.mss || n != tc.n || h.csumStart != tc.start ||
				h.csumOffset != 16 || h.flags != vnetFlagNeedsCsum || int(h.hdrLen) != int(tc.start)+20 {
				t.Fatalf("header %+v, %d segments, ok %v; want gso %d size %d, %d segments", h, n, ok, tc.gso, tc.mss, tc.n)
			}
			p := refPseudo(tc.src, tc.dst, protoTCP, 20+20000)
			if got := binary.BigEndian.Uint16(f[tc.start+16:]); got != p {
				t.Errorf("checksum field %#04x, want the pseudo-header sum %#04x", got, p)
			}
		})
	}
}
