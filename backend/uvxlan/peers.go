package uvxlan

import (
	"net/netip"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
	"golang.org/x/sys/unix"
)

// peer is where frames for one VTEP MAC go. The socket addresses are
// built once, so that sends do not allocate.
type peer struct {
	addr   netip.Addr
	sa     unix.Sockaddr         // for sendmsg
	raw    unix.RawSockaddrInet6 // for sendmmsg; holds a RawSockaddrInet4 for IPv4
	rawLen uint32
}

// peers is an immutable snapshot of the peer table, built on Set and read by
// the packet loops through an atomic pointer: the hot path takes no lock.
type peers struct {
	byMAC  map[subnet.MAC]*peer          // egress: inner destination MAC → underlay
	byAddr map[netip.Addr][]netip.Prefix // ingress: underlay address → the sender's subnets
}

// newPeers builds the snapshot for table t. Entries whose underlay address
// family differs from the local one are left out: one socket family carries
// all of this backend's traffic.
func newPeers(t vtep.Table, port int, ipv6 bool) *peers {
	p := &peers{byMAC: make(map[subnet.MAC]*peer, len(t)), byAddr: make(map[netip.Addr][]netip.Prefix, len(t))}
	for pfx, v := range t {
		a := v.Addr.Unmap()
		if !a.IsValid() || a.Is6() != ipv6 || v.MAC.IsZero() {
			continue
		}
		ap := netip.AddrPortFrom(a, uint16(port))
		pe := &peer{addr: a, sa: sockaddr(ap)}
		pe.raw, pe.rawLen = rawSockaddr(ap)
		p.byMAC[v.MAC] = pe
		p.byAddr[a] = append(p.byAddr[a], pfx.Masked())
	}
	return p
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}
