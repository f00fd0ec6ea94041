package masq

import (
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
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

// KubeProxyMark is the mark kube-proxy sets on packets it masquerades
// itself (its --masquerade-bit 14, Flannel's 0x4000/0x4000).
const KubeProxyMark = 0x4000

// specFor is the table for the cluster network n and this node's subnet s
// (invalid: no rule for it), see the package doc; keepPorts drops
// fully-random from the masquerade rules.
func specFor(n, s netip.Prefix, keepPorts bool) tableSpec {
	name, family, mcast := TableIPv4, nftables.TableFamilyIPv4, netip.MustParsePrefix("224.0.0.0/4")
	if n.Addr().Is6() {
		name, family, mcast = TableIPv6, nftables.TableFamilyIPv6, netip.MustParsePrefix("ff00::/8")
	}
	rules := []ruleSpec{
		{"weft: kube-proxy masquerades it", concat(markSet(KubeProxyMark), ret())},
		{"weft: pod to pod, no nat", concat(match(n, false), match(n, true), ret())},
		{"weft: multicast, no nat", concat(match(n, false), match(mcast, true), ret())},
		{"weft: pod leaving the cluster network", concat(match(n, false), masquerade(keepPorts))},
	}
	if s.IsValid() {
		rules = append(rules, ruleSpec{"weft: to this node's pods, no nat", concat(notMatch(n, false), match(s, true), ret())})
	}
	rules = append(rules, ruleSpec{"weft: to other nodes' pods from outside the cluster network",
		concat(notMatch(n, false), match(n, true), masquerade(keepPorts))})
	return tableSpec{name: name, family: family, chains: []chainSpec{{
		name: "postrouting", typ: nftables.ChainTypeNAT,
		hook: nftables.ChainHookPostrouting, priority: nftables.ChainPriorityNATSource,
		rules: rules,
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

// notMatch matches packets whose source (or destination) is outside p.
func notMatch(p netip.Prefix, dst bool) []expr.Any {
	m := match(p, dst)
	m[len(m)-1].(*expr.Cmp).Op = expr.CmpOpNeq
	return m
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

func ret() []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}} }

// masquerade translates the source to the outgoing interface's address, with
// a fully-random source port unless keepPorts: then the kernel keeps the
// pod's port when no other flow holds it.
func masquerade(keepPorts bool) []expr.Any { return []expr.Any{&expr.Masq{FullyRandom: !keepPorts}} }

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
