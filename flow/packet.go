package flow

import (
	"encoding/binary"
	"net/netip"
)

// fromPacket fills f's addresses, protocol and ports from the start of an
// IP packet (as NFLOG copies it). IPv6 extension headers are not walked:
// the protocol is then the first next-header and the ports are left out.
func fromPacket(f *Flow, b []byte) bool {
	if len(b) < 1 {
		return false
	}
	var proto uint8
	var l4 []byte
	switch b[0] >> 4 {
	case 4:
		ihl := int(b[0]&0x0f) * 4
		if len(b) < 20 || ihl < 20 {
			return false
		}
		f.Src, f.Dst = netip.AddrFrom4([4]byte(b[12:16])), netip.AddrFrom4([4]byte(b[16:20]))
		proto = b[9]
		if len(b) > ihl && binary.BigEndian.Uint16(b[6:8])&0x1fff == 0 { // first fragment
			l4 = b[ihl:]
		}
	case 6:
		if len(b) < 40 {
			return false
		}
		f.Src, f.Dst = netip.AddrFrom16([16]byte(b[8:24])), netip.AddrFrom16([16]byte(b[24:40]))
		proto = b[6]
		l4 = b[40:]
	default:
		return false
	}
	f.Proto = ProtoName(proto)
	if (proto == 6 || proto == 17 || proto == 132) && len(l4) >= 4 {
		f.SrcPort, f.DstPort = binary.BigEndian.Uint16(l4[0:2]), binary.BigEndian.Uint16(l4[2:4])
	}
	return true
}
