package vxlan

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend/nft"
	"github.com/weft-net/weft/vtep"
)

// FilterTable is the nftables table (family inet) in which the backend
// admits VXLAN datagrams from its peers only (see the package
// documentation).
const FilterTable = "weft-vxlan"

// The sets of the peers' underlay addresses, and the comments of the drop
// rules, which doctor and explain name.
const (
	PeerSet         = "peers"
	PeerSetV6       = "peers-v6"
	RuleNotPeer     = "weft: vxlan from a non-peer"
	RuleForeignSrc  = "weft: overlay source outside the cluster network"
	rulePeer        = "weft: vxlan from a peer"
	dropNotPeer     = "not_peer"
	dropForeignSrc  = "foreign_source"
	filterInputName = "input"
	// overlayChain is the start of the name of the chain on an overlay
	// device's ingress hook, which ends with the device's name (nft.Check
	// reads no device back: a chain of another device's name is not ours).
	overlayChain = "overlay-"
	// preroutingChain holds the same checks where the kernel refuses
	// chains on ingress hooks.
	preroutingChain = "prerouting"
)

// inetIngress is the ingress hook of the inet family, NF_INET_INGRESS
// (Linux 5.10), which x/sys names only as NF_INET_NUMHOOKS, its value;
// nftables.ChainHookIngress is the netdev family's.
var inetIngress = nftables.ChainHookRef(unix.NF_INET_NUMHOOKS)

// filterSpec is the filter table for the devices, without set elements:
//
//	table inet weft-vxlan {
//		set peers { type ipv4_addr }
//		set peers-v6 { type ipv6_addr }
//		chain input { type filter hook input priority filter
//			meta nfproto ipv4 udp dport <Port> ip saddr @peers accept
//			meta nfproto ipv6 udp dport <Port> ip6 saddr @peers-v6 accept
//			udp dport <Port> counter drop
//		}
//		chain overlay-weft.1 { type filter hook ingress device weft.1 priority raw
//			meta nfproto ipv4 ip saddr != <Network> counter drop
//		}
//		chain overlay-weft-v6.1 { type filter hook ingress device weft-v6.1 priority raw
//			meta nfproto ipv6 ip6 saddr != <IPv6Network> counter drop
//		}
//	}
//
// The overlay source check sits on each device's ingress hook (ingress,
// the inet family's), so that only the frames out of that device pass it:
// on the prerouting hook it cost every packet of the node, the VXLAN
// datagrams and the pods' own included, a chain to run. Linux 6.18, which
// the tests run on, keeps such a chain when its device goes and hooks it
// to a new device of the name; older kernels may delete the chain with
// its device and refuse one for a device that does not exist, so a full
// reconcile makes the devices before it checks the table, and writes the
// table again when a chain is missing. With ingress nil (a kernel that
// refuses chains on ingress hooks: before Linux 5.10, or without
// CONFIG_NETFILTER_INGRESS) the checks are one chain on the prerouting
// hook instead:
//
//	chain prerouting { type filter hook prerouting priority raw
//		iifname weft.1 meta nfproto ipv4 ip saddr != <Network> counter drop
//		iifname weft-v6.1 meta nfproto ipv6 ip6 saddr != <IPv6Network> counter drop
//	}
func filterSpec(c Config, devs []deviceSpec, ingress *nftables.ChainHook) nft.Table {
	input := []nft.Rule{
		{Comment: rulePeer, Exprs: nft.Concat(nfproto(unix.NFPROTO_IPV4), udpDport(c.Port), inSet(false, PeerSet), verdict(expr.VerdictAccept))},
		{Comment: rulePeer, Exprs: nft.Concat(nfproto(unix.NFPROTO_IPV6), udpDport(c.Port), inSet(true, PeerSetV6), verdict(expr.VerdictAccept))},
		{Comment: RuleNotPeer, Exprs: nft.Concat(udpDport(c.Port), []expr.Any{&expr.Counter{}}, verdict(expr.VerdictDrop))},
	}
	t := nft.Table{Name: FilterTable, Family: nftables.TableFamilyINet,
		Sets: []nft.Set{{Name: PeerSet, KeyType: nftables.TypeIPAddr}, {Name: PeerSetV6, KeyType: nftables.TypeIP6Addr}},
		Chains: []nft.Chain{{Name: filterInputName, Type: nftables.ChainTypeFilter,
			Hook: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Rules: input}}}
	var pre []nft.Rule
	for _, d := range devs {
		n, proto := c.Network, byte(unix.NFPROTO_IPV4)
		if d.local.Is6() {
			n, proto = c.IPv6Network, unix.NFPROTO_IPV6
		}
		if !n.IsValid() || c.AllowForeignSources {
			continue
		}
		check := nft.Concat(nfproto(proto), nft.NotMatch(n, false), []expr.Any{&expr.Counter{}}, verdict(expr.VerdictDrop))
		if ingress == nil {
			pre = append(pre, nft.Rule{Comment: RuleForeignSrc, Exprs: nft.Concat(iifname(d.name), check)})
			continue
		}
		t.Chains = append(t.Chains, nft.Chain{Name: overlayChain + d.name, Type: nftables.ChainTypeFilter,
			Hook: ingress, Priority: nftables.ChainPriorityRaw, Device: d.name,
			Rules: []nft.Rule{{Comment: RuleForeignSrc, Exprs: check}}})
	}
	if len(pre) > 0 {
		t.Chains = append(t.Chains, nft.Chain{Name: preroutingChain, Type: nftables.ChainTypeFilter,
			Hook: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw, Rules: pre})
	}
	return t
}

func iifname(name string) []expr.Any {
	b := make([]byte, 16)
	copy(b, name)
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b},
	}
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func udpDport(port int) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, uint16(port))},
	}
}

func inSet(ipv6 bool, set string) []expr.Any {
	off, size := nft.AddrOffset(ipv6, false)
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: size},
		&expr.Lookup{SourceRegister: 1, SetName: set},
	}
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

// peerAddrs are the underlay addresses of the table's peers.
func peerAddrs(t vtep.Table) map[netip.Addr]bool {
	out := make(map[netip.Addr]bool, len(t))
	for _, p := range t {
		if p.Addr.IsValid() {
			out[p.Addr.Unmap()] = true
		}
	}
	return out
}

// FilterDrops reads the counters of the filter table's drop rules in the
// namespace at netns ("" for the current one), by the reason uvxlan counts
// the same drops under: "not_peer" (datagrams to the VXLAN port from a
// host that is not a peer) and "foreign_source" (frames out of the overlay
// device with a source outside the cluster network). A missing table
// reports nothing and no error.
func FilterDrops(netns string) (map[string]uint64, error) {
	return nft.Counted(netns, FilterTable, nil,
		map[string]string{RuleNotPeer: dropNotPeer, RuleForeignSrc: dropForeignSrc})
}

// RemoveFilter deletes the filter table from the namespace at netns (""
// for the current one), for a node that runs another dataplane or turned
// the filter off: its sets would no longer follow the peers. A missing
// table, or a kernel without nf_tables, is not an error.
func RemoveFilter(netns string) error { return nft.Remove(netns, FilterTable) }
