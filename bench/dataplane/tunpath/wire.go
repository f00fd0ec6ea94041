package tunpath

import (
	"encoding/binary"
	"net/netip"

	"github.com/weft-net/weft/subnet"
)

// Sizes of the headers the node writes in front of an inner IP packet.
const (
	vxlanLen = 8
	ethLen   = 14
	// headroom is the room in front of each inner IP packet in the
	// buffers: the VXLAN and inner Ethernet headers. It is also the
	// offset at which wireguard-go's tun reads and writes IP packets,
	// which needs at least its virtio-net header's 10 bytes there.
	headroom = vxlanLen + ethLen
)

const (
	etherTypeIPv4 = 0x0800
	etherTypeIPv6 = 0x86dd
)

// Drop reasons, the keys of Stats().Drops.
const (
	DropNoPeer        = "no_peer"        // egress: no peer's subnet holds the destination
	DropNotIP         = "not_ip"         // egress: not an IPv4 or IPv6 packet
	DropSend          = "send"           // egress: the UDP send failed
	DropUnknownSource = "unknown_source" // ingress: not from a peer's underlay address
	DropShort         = "short"          // ingress: shorter than the headers
	DropTooLong       = "too_long"       // ingress: inner packet longer than the MTU
	DropFlags         = "flags"          // ingress: VXLAN flags other than exactly I
	DropVNI           = "vni"            // ingress: another VNI
	DropDestMAC       = "dest_mac"       // ingress: inner frame not for our VTEP MAC
	DropEtherType     = "ethertype"      // ingress: neither IPv4 nor IPv6
	DropIPHeader      = "ip_header"      // ingress: IP header inconsistent with the frame
	DropForeignSource = "foreign_source" // ingress: inner source outside the sending peer's subnet
	DropTUNWrite      = "tun_write"      // ingress: the TUN refused a batch's packet
	DropTUNRead       = "tun_read"       // egress: the TUN's offload code refused a packet read
)

// peer is one entry of the node's peer table.
type peer struct {
	subnet netip.Prefix
	addr   netip.Addr // underlay
	mac    subnet.MAC
}

// lookup returns the index of the peer whose subnet holds dst, or -1.
func lookup(peers []peer, dst netip.Addr) int {
	for i := range peers {
		if peers[i].subnet.Contains(dst) {
			return i
		}
	}
	return -1
}

// innerDst returns the destination address and the EtherType of the IP
// packet pkt; ok is false when pkt is not IPv4 or IPv6.
func innerDst(pkt []byte) (dst netip.Addr, etherType uint16, ok bool) {
	switch {
	case len(pkt) >= 20 && pkt[0]>>4 == 4:
		return netip.AddrFrom4([4]byte(pkt[16:20])), etherTypeIPv4, true
	case len(pkt) >= 40 && pkt[0]>>4 == 6:
		return netip.AddrFrom16([16]byte(pkt[24:40])), etherTypeIPv6, true
	}
	return netip.Addr{}, 0, false
}

// putHeaders writes the VXLAN header and the inner Ethernet header into
// h, which is headroom bytes long.
func putHeaders(h []byte, vni uint32, dst, src subnet.MAC, etherType uint16) {
	_ = h[headroom-1]
	binary.BigEndian.PutUint32(h[0:], 0x08000000) // the I flag
	binary.BigEndian.PutUint32(h[4:], vni<<8)
	copy(h[8:14], dst[:])
	copy(h[14:20], src[:])
	binary.BigEndian.PutUint16(h[20:], etherType)
}

// check takes a received datagram d from the underlay address from and
// returns the inner IP packet's length (cut to its IP header's), or the
// reason to drop it.
func check(d []byte, from netip.Addr, peers []peer, vni uint32, own subnet.MAC, mtu int) (n int, drop string) {
	from = from.Unmap()
	var p *peer
	for i := range peers {
		if peers[i].addr == from {
			p = &peers[i]
			break
		}
	}
	switch {
	case p == nil:
		return 0, DropUnknownSource
	case len(d) < headroom+20:
		return 0, DropShort
	case len(d) > headroom+mtu:
		return 0, DropTooLong
	case binary.BigEndian.Uint32(d[0:]) != 0x08000000:
		return 0, DropFlags
	case binary.BigEndian.Uint32(d[4:]) != vni<<8:
		return 0, DropVNI
	case subnet.MAC(d[8:14]) != own:
		return 0, DropDestMAC
	}
	pkt := d[headroom:]
	var src netip.Addr
	switch binary.BigEndian.Uint16(d[20:]) {
	case etherTypeIPv4:
		total := int(binary.BigEndian.Uint16(pkt[2:]))
		if pkt[0]>>4 != 4 || pkt[0]&0x0f < 5 || total < int(pkt[0]&0x0f)*4 || total > len(pkt) {
			return 0, DropIPHeader
		}
		n, src = total, netip.AddrFrom4([4]byte(pkt[12:16]))
	case etherTypeIPv6:
		if len(pkt) < 40 || pkt[0]>>4 != 6 {
			return 0, DropIPHeader
		}
		total := 40 + int(binary.BigEndian.Uint16(pkt[4:]))
		if total > len(pkt) {
			return 0, DropIPHeader
		}
		n, src = total, netip.AddrFrom16([16]byte(pkt[8:24]))
	default:
		return 0, DropEtherType
	}
	if !p.subnet.Contains(src) {
		return 0, DropForeignSource
	}
	return n, ""
}
