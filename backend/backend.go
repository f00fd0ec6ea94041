// Package backend defines what every weft dataplane implements, and the
// helpers they share: the stable VTEP MAC and the overlay MTU.
//
// The dataplanes live in subpackages: backend/vxlan programs a kernel VXLAN
// device over netlink; backend/uvxlan moves frames between a TAP device and a
// UDP socket in weftd itself. Both take the same vtep.Table and put the same
// frames on the wire, so their nodes interoperate with each other and with
// Flannel's vxlan backend.
package backend

import (
	"context"
	"crypto/sha256"
	"net/netip"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// Backend is a dataplane.
//
// Set may be called at any time, before Run and concurrently with it; it
// never blocks on the kernel. Run applies the latest table handed to Set,
// repairs drift until ctx is done, and returns after all its goroutines have
// exited. Run leaves the programmed state in place on return, so that a
// restarting daemon drops no traffic. Ready is closed once the device is up
// and the first table handed to Set has been programmed (the daemon reports
// ready, and in Kubernetes mode clears NetworkUnavailable, only then). Stats
// reports repairs, frames and drops (see Reporter).
type Backend interface {
	Run(ctx context.Context) error
	Set(t vtep.Table)
	Ready() <-chan struct{}
	Reporter
}

// VTEPMAC derives the VTEP device MAC of a node from its public address and
// the VNI. The result is a locally administered unicast address that stays the
// same across daemon restarts and device recreation, so peers never hold a
// stale FDB entry for us; distinct public addresses give distinct MACs.
func VTEPMAC(public netip.Addr, vni int) subnet.MAC {
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
