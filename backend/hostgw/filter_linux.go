package hostgw

import (
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend/nft"
	"github.com/weft-net/weft/vtep"
)

// FilterTable is the nftables table (family inet) in which a host-gw node
// drops pod-network sources that no peer's subnet holds (see the package
// documentation).
const FilterTable = "weft-hostgw"

// RuleNotPeerSubnet is the comment of the drop rules, which explain and
// doctor name.
const RuleNotPeerSubnet = "weft: pod-network source in no peer's subnet"

// Set names: the peers' subnets, by their first address.
const (
	SubnetSet   = "subnets"
	SubnetSetV6 = "subnets-v6"
)

// filterSpec is the filter table for this node, nil without a cluster
// network or a subnet to take the subnet length from:
//
//	table inet weft-hostgw {
//		set subnets { type ipv4_addr }      (each peer subnet's first address)
//		set subnets-v6 { type ipv6_addr }
//		chain prerouting { type filter hook prerouting priority raw
//			iifname <underlay> ip saddr <Network> ip saddr & <subnet mask> != @subnets counter drop
//			iifname <underlay> ip6 saddr <IPv6Network> ip6 saddr & <subnet mask> != @subnets-v6 counter drop
//		}
//	}
//
// Every subnet of a network has the same length (leases are checked for it
// where they enter), so masking the source and looking the result up is
// one hash lookup per packet from the pod network.
func filterSpec(c Config, underlay string) *nft.Table {
	var rules []nft.Rule
	for _, f := range []struct {
		network, own netip.Prefix
		proto        byte
		set          string
	}{{c.Network, c.Subnet, unix.NFPROTO_IPV4, SubnetSet}, {c.IPv6Network, c.IPv6Subnet, unix.NFPROTO_IPV6, SubnetSetV6}} {
		if !f.network.IsValid() || !f.own.IsValid() {
			continue
		}
		off, size := nft.AddrOffset(f.network.Addr().Is6(), false)
		rules = append(rules, nft.Rule{Comment: RuleNotPeerSubnet, Exprs: nft.Concat(
			[]expr.Any{
				&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(underlay)},
				&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.proto}},
			},
			nft.Match(f.network, false),
			[]expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: size},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: size,
					Mask: net.CIDRMask(f.own.Bits(), f.own.Addr().BitLen()), Xor: make([]byte, size)},
				&expr.Lookup{SourceRegister: 1, SetName: f.set, Invert: true},
				&expr.Counter{},
				&expr.Verdict{Kind: expr.VerdictDrop},
			})})
	}
	if len(rules) == 0 {
		return nil
	}
	return &nft.Table{Name: FilterTable, Family: nftables.TableFamilyINet,
		Sets: []nft.Set{{Name: SubnetSet, KeyType: nftables.TypeIPAddr}, {Name: SubnetSetV6, KeyType: nftables.TypeIP6Addr}},
		Chains: []nft.Chain{{Name: "prerouting", Type: nftables.ChainTypeFilter,
			Hook: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw, Rules: rules}}}
}

func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}

// peerSubnets are the first addresses of the table's subnets.
func peerSubnets(t vtep.Table) map[netip.Addr]bool {
	out := make(map[netip.Addr]bool, len(t))
	for p := range t {
		out[p.Masked().Addr()] = true
	}
	return out
}

// FilterDrops reads what the drop rules of the filter table in the
// namespace at netns ("" for the current one) counted, as drops
// "not_peer_subnet". A missing table reports nothing and no error.
func FilterDrops(netns string) (map[string]uint64, error) {
	return nft.Counted(netns, FilterTable, []string{"prerouting"}, map[string]string{RuleNotPeerSubnet: "not_peer_subnet"})
}

// RemoveFilter deletes the filter table from the namespace at netns, for a
// node that runs another dataplane: its sets would no longer follow the
// peers. A missing table, or a kernel without nf_tables, is not an error.
func RemoveFilter(netns string) error { return nft.Remove(netns, FilterTable) }
