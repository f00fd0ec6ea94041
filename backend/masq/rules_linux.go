package masq

import (
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
)

// tableSpec is one of weft's tables as it should be.
type tableSpec struct {
	name   string
	family nftables.TableFamily
	chains []chainSpec
}

type chainSpec struct {
	name     string
	typ      nftables.ChainType
	hook     *nftables.ChainHook
	priority *nftables.ChainPriority
	rules    []ruleSpec
}

type ruleSpec struct {
	comment string
	exprs   []expr.Any
}

func (t tableSpec) chain(name string) *chainSpec {
	for i := range t.chains {
		if t.chains[i].name == name {
			return &t.chains[i]
		}
	}
	return nil
}

// comment is the rule's user data as nft(8) writes a comment, so that
// `nft list table` shows it.
func comment(s string) []byte { return userdata.AppendString(nil, userdata.TypeComment, s) }

// specFor is the table for the cluster network n (see the package doc).
func specFor(n netip.Prefix) tableSpec {
	name, family, mcast := TableIPv4, nftables.TableFamilyIPv4, netip.MustParsePrefix("224.0.0.0/4")
	if n.Addr().Is6() {
		name, family, mcast = TableIPv6, nftables.TableFamilyIPv6, netip.MustParsePrefix("ff00::/8")
	}
	return tableSpec{name: name, family: family, chains: []chainSpec{
		{
			name: "postrouting", typ: nftables.ChainTypeNAT,
			hook: nftables.ChainHookPostrouting, priority: nftables.ChainPriorityNATSource,
			rules: []ruleSpec{
				{"weft: pod to pod, no nat", concat(match(n, false), match(n, true), ret())},
				{"weft: multicast, no nat", concat(match(n, false), match(mcast, true), ret())},
				{"weft: pod leaving the cluster network", concat(match(n, false), masquerade())},
			},
		},
		{
			name: "forward", typ: nftables.ChainTypeFilter,
			hook: nftables.ChainHookForward, priority: nftables.ChainPriorityFilter,
			rules: []ruleSpec{
				{"weft: from pods", concat(match(n, false), accept())},
				{"weft: to pods", concat(match(n, true), accept())},
			},
		},
	}}
}

// match matches packets whose source (or destination, dst) address is in p.
func match(p netip.Prefix, dst bool) []expr.Any {
	off, size := uint32(12), uint32(4) // IPv4 saddr
	if p.Addr().Is6() {
		off, size = 8, 16
	}
	if dst {
		off += size
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: size},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: size,
			Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen()), Xor: make([]byte, size)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

func ret() []expr.Any    { return []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}} }
func accept() []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}} }

func masquerade() []expr.Any { return []expr.Any{&expr.Masq{FullyRandom: true}} }

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
