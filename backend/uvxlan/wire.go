package uvxlan

import (
	"encoding/binary"
	"net/netip"

	"github.com/weft-net/weft/subnet"
)

// Sizes of the headers this package reads and writes.
const (
	vxlanHeaderLen = 8
	ethHeaderLen   = 14
	vxlanFlagI     = 0x08 // the only flag Linux accepts: "VNI is valid"
	maxVNI         = 1<<24 - 1
)

// EtherTypes of the inner frames.
const (
	etherTypeIPv4 = 0x0800
	etherTypeIPv6 = 0x86dd
)

// putVXLANHeader writes the 8-byte VXLAN header for vni into b: flags 0x08,
// three reserved zero bytes, the 24-bit VNI and one reserved zero byte.
func putVXLANHeader(b []byte, vni uint32) {
	_ = b[7]
	b[0], b[1], b[2], b[3] = vxlanFlagI, 0, 0, 0
	b[4], b[5], b[6], b[7] = byte(vni>>16), byte(vni>>8), byte(vni), 0
}

// decoder validates VXLAN datagrams received for one VTEP.
type decoder struct {
	vni      uint32
	mac      subnet.MAC // our VTEP MAC: the only inner destination accepted
	maxFrame int        // largest inner frame: Ethernet header + overlay MTU
}

// decode checks a VXLAN datagram (UDP payload) and returns the inner
// Ethernet frame, or the reason to drop it. The checks follow what Linux
// enforces: exactly the I flag, every reserved bit zero, our VNI. Only
// frames addressed to our VTEP MAC are accepted; broadcast and multicast are
// not, because weft peers never flood (their neighbour entries are
// permanent) and a flood could only come from a misconfigured or hostile
// sender.
func (d *decoder) decode(pkt []byte) ([]byte, DropReason) {
	if len(pkt) > vxlanHeaderLen+d.maxFrame {
		return nil, DropOversize
	}
	return d.decodeAnySize(pkt)
}

// decodeAnySize is decode without the size limit, for a tunnel-GSO
// super-packet (see tunnelGSO).
func (d *decoder) decodeAnySize(pkt []byte) ([]byte, DropReason) {
	if len(pkt) < vxlanHeaderLen+ethHeaderLen {
		return nil, DropTruncated
	}
	if pkt[0] != vxlanFlagI || pkt[1]|pkt[2]|pkt[3]|pkt[7] != 0 {
		return nil, DropBadFlags
	}
	if uint32(pkt[4])<<16|uint32(pkt[5])<<8|uint32(pkt[6]) != d.vni {
		return nil, DropWrongVNI
	}
	frame := pkt[vxlanHeaderLen:]
	if subnet.MAC(frame[0:6]) != d.mac {
		return nil, DropNotForUs
	}
	return frame, DropNone
}

// tunnelGSO reports whether pkt, a received UDP payload larger than one
// VXLAN packet may be, is a single VXLAN packet whose inner IP packet spans
// all of it: a tunnel-GSO super-packet. A kernel VXLAN sender whose underlay
// is a veth hands its TCP super-segments (up to 64 KB) to the peer's
// namespace unsegmented, and a UDP socket there receives them whole. (UDP
// GRO output, several datagrams back to back, never spans the buffer with
// its first inner packet.)
func (d *decoder) tunnelGSO(pkt []byte) bool {
	if len(pkt) <= vxlanHeaderLen+d.maxFrame || len(pkt) < vxlanHeaderLen+ethHeaderLen+ipv6HeaderLen {
		return false
	}
	frame := pkt[vxlanHeaderLen:]
	ip := frame[ethHeaderLen:]
	switch binary.BigEndian.Uint16(frame[12:14]) {
	case etherTypeIPv4:
		return ip[0]>>4 == 4 && int(binary.BigEndian.Uint16(ip[2:4])) == len(ip)
	case etherTypeIPv6:
		return ip[0]>>4 == 6 && ipv6HeaderLen+int(binary.BigEndian.Uint16(ip[4:6])) == len(ip)
	}
	return false
}

// dstMAC returns the destination MAC of an Ethernet frame of at least 6 bytes.
func dstMAC(frame []byte) subnet.MAC { return subnet.MAC(frame[0:6]) }

// flowHash hashes the inner flow of an Ethernet frame (addresses, protocol
// and, for unfragmented TCP/UDP/SCTP, ports) so that one flow always leaves
// from the same outer source port and different flows spread over ECMP paths
// and receive queues, as the kernel's VXLAN does. Other frames hash their
// Ethernet header.
func flowHash(frame []byte) uint32 {
	const (
		offset32 = 2166136261
		prime32  = 16777619
	)
	h := uint32(offset32)
	mix := func(b []byte) {
		for _, c := range b {
			h ^= uint32(c)
			h *= prime32
		}
	}
	if len(frame) < ethHeaderLen {
		mix(frame)
		return h
	}
	ip := frame[ethHeaderLen:]
	switch binary.BigEndian.Uint16(frame[12:14]) {
	case etherTypeIPv4:
		if len(ip) < 20 {
			break
		}
		ihl := int(ip[0]&0x0f) * 4
		mix(ip[12:20])
		mix(ip[9:10])
		fragmented := binary.BigEndian.Uint16(ip[6:8])&0x3fff != 0
		if !fragmented && hasPorts(ip[9]) && len(ip) >= ihl+4 {
			mix(ip[ihl : ihl+4])
		}
		return h
	case etherTypeIPv6:
		if len(ip) < 40 {
			break
		}
		mix(ip[8:40])
		mix(ip[6:7])
		if hasPorts(ip[6]) && len(ip) >= 44 {
			mix(ip[40:44])
		}
		return h
	}
	mix(frame[:ethHeaderLen])
	return h
}

func hasPorts(proto byte) bool { return proto == 6 || proto == 17 || proto == 132 }

// subnetAddr is the address a node puts on its overlay device and that
// peers use as the gateway of its subnet: the subnet's network address
// (10.244.59.0 for 10.244.59.0/24).
func subnetAddr(p netip.Prefix) netip.Addr { return p.Masked().Addr() }
