package vtep

import (
	"crypto/sha256"
	"net/netip"

	"github.com/weft-net/weft/subnet"
)

// DeviceMAC derives the VTEP device MAC of a node from its public address and
// the VNI. The result is a locally administered unicast address that stays the
// same across daemon restarts and device recreation, so peers never hold a
// stale FDB entry for us; distinct public addresses give distinct MACs.
func DeviceMAC(public netip.Addr, vni int) subnet.MAC {
	h := sha256.New()
	h.Write([]byte("weft-vtep\x00"))
	b := public.As16()
	h.Write(b[:])
	h.Write([]byte{byte(vni >> 16), byte(vni >> 8), byte(vni)})
	var m subnet.MAC
	copy(m[:], h.Sum(nil))
	m[0] = m[0]&^0x01 | 0x02 // unicast, locally administered
	return m
}

// VXLAN encapsulation overhead: outer IP + UDP (8) + VXLAN (8) + inner Ethernet (14).
const (
	OverheadIPv4 = 20 + 8 + 8 + 14
	OverheadIPv6 = 40 + 8 + 8 + 14
)

// OverlayMTU returns the MTU of the overlay device for an underlay MTU: 1450
// on a 1500-byte IPv4 underlay, 1430 on IPv6.
func OverlayMTU(underlayMTU int, underlayIPv6 bool) int {
	if underlayIPv6 {
		return underlayMTU - OverheadIPv6
	}
	return underlayMTU - OverheadIPv4
}
