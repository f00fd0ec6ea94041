package masq

import (
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"

	"github.com/weft-net/weft/backend/nft"
)

// KubeProxyMark is the mark kube-proxy sets on packets it masquerades
// itself (its --masquerade-bit 14, Flannel's 0x4000/0x4000).
const KubeProxyMark = 0x4000

// specFor is the table for the cluster network n and this node's subnet s
// (invalid: no rule for it), see the package doc; keepPorts drops
// fully-random from the masquerade rules.
func specFor(n, s netip.Prefix, keepPorts bool) nft.Table {
	name, family, mcast := TableIPv4, nftables.TableFamilyIPv4, netip.MustParsePrefix("224.0.0.0/4")
	if n.Addr().Is6() {
		name, family, mcast = TableIPv6, nftables.TableFamilyIPv6, netip.MustParsePrefix("ff00::/8")
	}
	rules := []nft.Rule{
		{Comment: "weft: kube-proxy masquerades it", Exprs: nft.Concat(markSet(KubeProxyMark), ret())},
		{Comment: "weft: pod to pod, no nat", Exprs: nft.Concat(nft.Match(n, false), nft.Match(n, true), ret())},
		{Comment: "weft: multicast, no nat", Exprs: nft.Concat(nft.Match(n, false), nft.Match(mcast, true), ret())},
		{Comment: "weft: pod leaving the cluster network", Exprs: nft.Concat(nft.Match(n, false), masquerade(keepPorts))},
	}
	if s.IsValid() {
		rules = append(rules, nft.Rule{Comment: "weft: to this node's pods, no nat", Exprs: nft.Concat(nft.NotMatch(n, false), nft.Match(s, true), ret())})
	}
	rules = append(rules, nft.Rule{Comment: "weft: to other nodes' pods from outside the cluster network",
		Exprs: nft.Concat(nft.NotMatch(n, false), nft.Match(n, true), masquerade(keepPorts))})
	return nft.Table{Name: name, Family: family, Chains: []nft.Chain{{
		Name: "postrouting", Type: nftables.ChainTypeNAT,
		Hook: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource,
		Rules: rules,
	}}}
}

// markSet matches packets whose mark has every bit of m set.
func markSet(m uint32) []expr.Any {
	v := binaryutil.NativeEndian.PutUint32(m)
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: v, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: v},
	}
}

func ret() []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}} }

// masquerade translates the source to the outgoing interface's address, with
// a fully-random source port unless keepPorts: then the kernel keeps the
// pod's port when no other flow holds it.
func masquerade(keepPorts bool) []expr.Any { return []expr.Any{&expr.Masq{FullyRandom: !keepPorts}} }
