package wireguard

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// Device names and the encapsulation overhead, Flannel's.
const (
	DeviceName   = "flannel-wg"
	DeviceNameV6 = "flannel-wg-v6"
	// Overhead is what WireGuard adds to an inner packet, counted for an
	// IPv6 outer header as Flannel does: 40 + UDP 8 + type 4 + index 4 +
	// nonce 8 + tag 16.
	Overhead = 80
)

// deviceSpec is one device the backend keeps.
type deviceSpec struct {
	name   string
	port   int
	v4, v6 bool           // families whose peers it carries
	addrs  []netip.Prefix // <own subnet>.0/32, <own subnet>::/128
	routes []netip.Prefix // the cluster networks routed through it
}

// specs returns the devices of cfg's mode.
func (c Config) specs() []deviceSpec {
	own := func(p netip.Prefix) netip.Prefix { return netip.PrefixFrom(p.Masked().Addr(), p.Addr().BitLen()) }
	var out []deviceSpec
	if c.Mode == subnet.WireGuardSeparate {
		if c.Subnet.IsValid() {
			out = append(out, deviceSpec{name: DeviceName, port: c.ListenPort, v4: true,
				addrs: []netip.Prefix{own(c.Subnet)}, routes: []netip.Prefix{c.Network}})
		}
		if c.IPv6Subnet.IsValid() {
			out = append(out, deviceSpec{name: DeviceNameV6, port: c.ListenPortV6, v6: true,
				addrs: []netip.Prefix{own(c.IPv6Subnet)}, routes: []netip.Prefix{c.IPv6Network}})
		}
		return out
	}
	d := deviceSpec{name: DeviceName, port: c.ListenPort}
	if c.Subnet.IsValid() {
		d.v4, d.addrs, d.routes = true, append(d.addrs, own(c.Subnet)), append(d.routes, c.Network)
	}
	if c.IPv6Subnet.IsValid() {
		d.v6, d.addrs, d.routes = true, append(d.addrs, own(c.IPv6Subnet)), append(d.routes, c.IPv6Network)
	}
	return append(out, d)
}

// Peer is one WireGuard peer as it should be on a device.
type Peer struct {
	Key        string // public key, base64
	Endpoint   netip.AddrPort
	AllowedIPs []netip.Prefix // sorted
	// LastHandshake is, in a peer read from a device (Peers), when its
	// last handshake completed; zero when none did. Not configured.
	LastHandshake time.Time
}

// peersFor returns the peers of device d for table t, sorted by key: the
// table's rows of d's families grouped by public key, each with the
// endpoint its mode picks. Rows without a usable endpoint are left out.
func (c Config) peersFor(d deviceSpec, t vtep.Table) []Peer {
	type rows struct{ v4, v6 *vtep.Entry }
	byKey := map[string]*rows{}
	var allowed = map[string][]netip.Prefix{}
	for _, e := range t.Entries() {
		is4 := e.Subnet.Addr().Is4()
		if e.Peer.Data == "" || is4 && !d.v4 || !is4 && !d.v6 {
			continue
		}
		r := byKey[e.Peer.Data]
		if r == nil {
			r = &rows{}
			byKey[e.Peer.Data] = r
		}
		e := e
		if is4 {
			r.v4 = &e
		} else {
			r.v6 = &e
		}
		allowed[e.Peer.Data] = append(allowed[e.Peer.Data], e.Subnet)
	}
	var out []Peer
	for key, r := range byKey {
		ep, ok := c.endpoint(d, r.v4, r.v6)
		if !ok {
			continue
		}
		a := allowed[key]
		slices.SortFunc(a, comparePrefix)
		out = append(out, Peer{Key: key, Endpoint: ep, AllowedIPs: a})
	}
	slices.SortFunc(out, func(a, b Peer) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// endpoint picks a peer's endpoint from its IPv4 and IPv6 rows: in separate
// mode the device's family; in ipv4/ipv6 that family; in auto Flannel's
// choice (IPv4 when the peer has no IPv6 address, or a public IPv4 one and
// this node IPv4; else IPv6 when the peer's and this node's IPv6 addresses
// are both public; else IPv4). The port is the one in the peer's lease, or
// the device's own when the lease names none.
func (c Config) endpoint(d deviceSpec, v4, v6 *vtep.Entry) (netip.AddrPort, bool) {
	v4ok := v4 != nil && v4.Peer.Addr.IsValid()
	v6ok := v6 != nil && v6.Peer.Addr.IsValid()
	use4 := v4ok
	switch c.Mode {
	case subnet.WireGuardIPv6:
		use4 = false
	case subnet.WireGuardAuto:
		switch {
		case !v6ok, v4ok && !v4.Peer.Addr.IsPrivate() && c.Local.IsValid():
			use4 = true
		case !v6.Peer.Addr.IsPrivate() && c.LocalIPv6.IsValid() && !c.LocalIPv6.IsPrivate():
			use4 = false
		default:
			use4 = true
		}
	}
	e, ok := v6, v6ok
	if use4 {
		e, ok = v4, v4ok
	}
	if !ok {
		return netip.AddrPort{}, false
	}
	port := uint16(d.port)
	if e.Peer.Port != 0 {
		port = e.Peer.Port
	}
	return netip.AddrPortFrom(e.Peer.Addr, port), true
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// peerConfig is the wgctrl form of setting p (creating or updating it).
func (c Config) peerConfig(p Peer) (wgtypes.PeerConfig, error) {
	k, err := wgtypes.ParseKey(p.Key)
	if err != nil {
		return wgtypes.PeerConfig{}, fmt.Errorf("peer key %q: %w", p.Key, err)
	}
	pc := wgtypes.PeerConfig{PublicKey: k, PresharedKey: c.PSK, ReplaceAllowedIPs: true,
		Endpoint: net.UDPAddrFromAddrPort(p.Endpoint)}
	ka := time.Duration(c.Keepalive) * time.Second
	pc.PersistentKeepaliveInterval = &ka
	for _, a := range p.AllowedIPs {
		pc.AllowedIPs = append(pc.AllowedIPs, net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())})
	}
	return pc, nil
}

// uapi is the wireguard-go (cross-platform UAPI) text that sets the peers
// in set and removes the ones keyed in remove, with the private key and
// port when key is not nil.
func (c Config) uapi(key *wgtypes.Key, port int, set []Peer, remove []string) (string, error) {
	var b strings.Builder
	if key != nil {
		fmt.Fprintf(&b, "private_key=%x\nlisten_port=%d\n", key[:], port)
	}
	for _, k := range remove {
		pk, err := wgtypes.ParseKey(k)
		if err != nil {
			return "", fmt.Errorf("peer key %q: %w", k, err)
		}
		fmt.Fprintf(&b, "public_key=%x\nremove=true\n", pk[:])
	}
	for _, p := range set {
		pk, err := wgtypes.ParseKey(p.Key)
		if err != nil {
			return "", fmt.Errorf("peer key %q: %w", p.Key, err)
		}
		fmt.Fprintf(&b, "public_key=%x\n", pk[:])
		if c.PSK != nil {
			fmt.Fprintf(&b, "preshared_key=%x\n", c.PSK[:])
		}
		fmt.Fprintf(&b, "endpoint=%s\npersistent_keepalive_interval=%d\nreplace_allowed_ips=true\n", p.Endpoint, c.Keepalive)
		for _, a := range p.AllowedIPs {
			fmt.Fprintf(&b, "allowed_ip=%s\n", a)
		}
	}
	return b.String(), nil
}
