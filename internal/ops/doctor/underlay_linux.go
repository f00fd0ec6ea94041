package doctor

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/subnet"
)

// underlayFamily is an address family the overlay's datagrams reach this
// node over: the UDP port they arrive on and the peers that send them.
type underlayFamily struct {
	v6    bool
	port  uint16
	peers []underlayPeer
}

// underlayPeer is a peer by its underlay address of one family.
type underlayPeer struct {
	addr   netip.Addr
	subnet netip.Prefix // its node subnet, to name it
}

func (p underlayPeer) String() string { return fmt.Sprintf("%s (%s)", p.addr, p.subnet) }

func (f underlayFamily) String() string {
	if f.v6 {
		return "IPv6"
	}
	return "IPv4"
}

// applies reports whether the input chains of a table of family tf see
// this family's datagrams: ip tables IPv4's, ip6 tables IPv6's, inet and
// bridge tables both, arp tables none.
func (f underlayFamily) applies(tf nftables.TableFamily) bool {
	switch tf {
	case nftables.TableFamilyIPv4:
		return !f.v6
	case nftables.TableFamilyIPv6:
		return f.v6
	case nftables.TableFamilyARP:
		return false
	}
	return true
}

// underlayFamilies are the families this node's overlay datagrams arrive
// over: those of the public addresses in its lease (IPv4 unless it has
// none, IPv6 when it has one), else the family of the VXLAN device's local
// address. A WireGuard node in mode ipv4 or ipv6 uses that family alone,
// and in separate mode its IPv6 device's port for IPv6. When nothing
// tells (no lease for this node, no VXLAN device: a uvxlan TAP, WireGuard
// in another mode), both families, and unknown says why in the report's
// words. Each family carries the peers' underlay addresses of that family.
func (s *state) underlayFamilies(port int) (fams []underlayFamily, unknown string) {
	var v4, v6 bool
	switch {
	case s.self != nil:
		v4, v6 = usable(s.self.Attrs.PublicIP), usable(s.self.Attrs.PublicIPv6)
	case s.k != nil && s.k.Device.Local.IsValid():
		v4, v6 = s.k.Device.Local.Unmap().Is4(), s.k.Device.Local.Unmap().Is6()
	}
	b := s.Config.Backend
	if b.Type == subnet.BackendTypeWireGuard {
		switch b.Mode {
		case subnet.WireGuardIPv4:
			v4, v6 = true, false
		case subnet.WireGuardIPv6:
			v4, v6 = false, true
		}
	}
	if !v4 && !v6 {
		v4, v6 = true, true
		unknown = "no lease for this node and no VXLAN device's local address"
		if s.self != nil {
			unknown = "this node's lease has no public address"
		}
		unknown += ": the underlay's family is not known, IPv4 and IPv6 checked"
	}
	var out []underlayFamily
	if v4 {
		out = append(out, underlayFamily{port: uint16(port)})
	}
	if v6 {
		f := underlayFamily{v6: true, port: uint16(port)}
		if b.Type == subnet.BackendTypeWireGuard && b.Mode == subnet.WireGuardSeparate {
			f.port = uint16(b.ListenPortV6)
		}
		out = append(out, f)
	}
	for i := range out {
		for _, l := range s.peers() {
			p := underlayPeer{addr: l.Attrs.PublicIP, subnet: l.Subnet}
			if out[i].v6 {
				p = underlayPeer{addr: l.Attrs.PublicIPv6, subnet: cmpPrefix(l.IPv6Subnet, l.Subnet)}
			}
			if usable(p.addr) {
				out[i].peers = append(out[i].peers, p)
			}
		}
	}
	return out, unknown
}

func usable(a netip.Addr) bool { return a.IsValid() && !a.IsUnspecified() }

func cmpPrefix(a, b netip.Prefix) netip.Prefix {
	if a.IsValid() {
		return a
	}
	return b
}

// excludesFamily reports whether a rule matches only packets of the other
// family than the one evaluated: `meta nfproto ipv4` (or `!= ipv6`),
// `meta protocol ip` (the EtherType, in bridge and netdev tables).
func excludesFamily(exprs []expr.Any, v6 bool) bool {
	nfproto, ethertype := []byte{unix.NFPROTO_IPV4}, binary.BigEndian.AppendUint16(nil, unix.ETH_P_IP)
	if v6 {
		nfproto, ethertype = []byte{unix.NFPROTO_IPV6}, binary.BigEndian.AppendUint16(nil, unix.ETH_P_IPV6)
	}
	var want []byte // what the last load is compared with for this family
	for _, e := range exprs {
		switch e := e.(type) {
		case *expr.Meta:
			want = nil
			switch e.Key {
			case expr.MetaKeyNFPROTO:
				want = nfproto
			case expr.MetaKeyPROTOCOL:
				want = ethertype
			}
		case *expr.Cmp:
			if want != nil {
				same := string(e.Data) == string(want)
				if e.Op == expr.CmpOpEq && !same || e.Op == expr.CmpOpNeq && same {
					return true
				}
			}
			want = nil
		case *expr.Counter, *expr.Log:
		default:
			want = nil
		}
	}
	return false
}

// familyLoad is a load of the packet's family (meta nfproto, meta
// protocol): once excludesFamily has ruled out the other family, an equal
// or unequal compare of it matches the evaluated family.
func familyLoad(e *expr.Meta) bool {
	return e.Key == expr.MetaKeyNFPROTO || e.Key == expr.MetaKeyPROTOCOL
}

// networkField is what a load from the network header reads, in the
// evaluated family's header: the layer-4 protocol, the source address (or
// its leading bytes), or something else.
func networkField(p *expr.Payload, v6 bool) (proto, saddr bool) {
	if v6 {
		return p.Offset == 6 && p.Len == 1, p.Offset == 8 && p.Len >= 1 && p.Len <= 16
	}
	return p.Offset == 9 && p.Len == 1, p.Offset == 12 && p.Len >= 1 && p.Len <= 4
}

// sourcePrefix is the prefix a source match selects: nft compares the
// leading bytes of the address (ip saddr 192.168.77.0/24 compares 3),
// masked when the length is not a multiple of 8; iptables-nft compares
// all of it under a mask. ok is false for a mask that is not a prefix or
// data outside it.
func sourcePrefix(data, mask []byte, v6 bool) (netip.Prefix, bool) {
	full := 4
	if v6 {
		full = 16
	}
	if len(data) == 0 || len(data) > full || mask != nil && len(mask) != len(data) {
		return netip.Prefix{}, false
	}
	b, bits, ended := make([]byte, full), 0, false
	copy(b, data)
	for i := range data {
		m := byte(0xff)
		if mask != nil {
			m = mask[i]
		}
		if data[i]&^m != 0 || ended && m != 0 {
			return netip.Prefix{}, false
		}
		for x := m; x != 0; x <<= 1 {
			if x&0x80 == 0 {
				return netip.Prefix{}, false
			}
			bits++
		}
		ended = m != 0xff
	}
	a, _ := netip.AddrFromSlice(b)
	return netip.PrefixFrom(a, bits), true
}

// acceptSources is the fix that accepts the port from peers (those left
// out, or dropped in a chain reached through a source match): in the
// chain's table, or through iptables for iptables-nft's INPUT.
func acceptSources(v portVerdict, peers []underlayPeer) string {
	ip, cmd := "ip", "iptables"
	if v.family.v6 {
		ip, cmd = "ip6", "ip6tables"
	}
	addrs := make([]string, len(peers))
	for i, p := range peers {
		addrs[i] = p.addr.String()
	}
	if iptablesInput(v.chain) {
		return fmt.Sprintf("%s -I INPUT -s %s -p udp --dport %d -j ACCEPT", cmd, strings.Join(addrs, ","), v.family.port)
	}
	return fmt.Sprintf("nft insert rule %s %s %s %s saddr { %s } udp dport %d accept",
		familyName(v.chain.family), v.chain.table, v.chain.name, ip, strings.Join(addrs, ", "), v.family.port)
}

// iptablesInput reports whether c is iptables-nft's (or ip6tables-nft's)
// INPUT chain, which the iptables commands change.
func iptablesInput(c dropChain) bool {
	return c.table == "filter" && c.name == "INPUT" && (c.family == nftables.TableFamilyIPv4 || c.family == nftables.TableFamilyIPv6)
}
