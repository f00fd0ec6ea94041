package inspect

import (
	"net/netip"
	"slices"

	"github.com/weft-net/weft/subnet"
)

// Device kinds.
const (
	KindVXLAN = "vxlan" // kernel VXLAN device: the kernel encapsulates
	KindTAP   = "tap"   // weft's userspace VTEP (uvxlan): weftd encapsulates
	// KindWireGuard is a WireGuard device: the kernel's, or the TUN that
	// weftd's in-process WireGuard (wireguard-go) runs on.
	KindWireGuard = "wireguard"
)

// wireGuardDevice is the WireGuard backend's device (IPv4, or both
// families); its IPv6 device in Mode "separate" adds "-v6".
const wireGuardDevice = "flannel-wg"

// Device is a node's overlay link.
type Device struct {
	Name     string
	Index    int
	Kind     string
	VNI      int        // vxlan only
	Port     int        // vxlan only
	Local    netip.Addr // vxlan only: the underlay address it sends from
	Underlay string     // vxlan only: the underlay link
	MTU      int
	MAC      subnet.MAC
	Addrs    []netip.Prefix
	Up       bool
}

// Neighbour is a neighbour entry on the overlay device.
type Neighbour struct {
	IP        netip.Addr
	MAC       subnet.MAC
	Permanent bool
}

// FDBEntry maps a VTEP MAC to a remote underlay address (vxlan only).
type FDBEntry struct {
	MAC subnet.MAC
	Dst netip.Addr
}

// Route is a route through the overlay device.
type Route struct {
	Dst    netip.Prefix
	Gw     netip.Addr
	OnLink bool
	Proto  int
}

// Kernel is what one node has programmed on its overlay device.
type Kernel struct {
	Device     Device
	Neighbours []Neighbour
	FDB        []FDBEntry
	Routes     []Route
}

// neighbour returns the neighbour entry for ip.
func (k *Kernel) neighbour(ip netip.Addr) (Neighbour, bool) {
	i := slices.IndexFunc(k.Neighbours, func(n Neighbour) bool { return n.IP == ip })
	if i < 0 {
		return Neighbour{}, false
	}
	return k.Neighbours[i], true
}

// fdb returns the remote underlay addresses for mac.
func (k *Kernel) fdb(mac subnet.MAC) []netip.Addr {
	var out []netip.Addr
	for _, e := range k.FDB {
		if e.MAC == mac {
			out = append(out, e.Dst)
		}
	}
	return out
}

// route returns the route for exactly dst.
func (k *Kernel) route(dst netip.Prefix) (Route, bool) {
	i := slices.IndexFunc(k.Routes, func(r Route) bool { return r.Dst == dst })
	if i < 0 {
		return Route{}, false
	}
	return k.Routes[i], true
}

// OwnSubnetAddr returns the address weftd puts on its overlay device (the
// first address of its own subnet, as a /32 or /128), if any.
func (k *Kernel) OwnSubnetAddr() (netip.Addr, bool) {
	for _, a := range k.Device.Addrs {
		if a.Addr().Is4() {
			return a.Addr(), true
		}
	}
	return netip.Addr{}, false
}

// PodLink is how a pod is wired to its node: the pod's interface holding
// its address, the node's end of the veth pair, and the bridge that end is
// a port of.
type PodLink struct {
	Iface    string       // in the pod, usually eth0
	Addr     netip.Prefix // the pod's address on Iface
	Gateway  netip.Addr   // the pod's default gateway (invalid: none)
	HostVeth string       // in the node
	Bridge   string       // in the node ("" when the veth is on no bridge)
}
