package policy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend/nft"
	"github.com/weft-net/weft/flow"
)

// This file builds the inet table: per family, the forward chain, the
// egress and ingress chains with a rule per policy rule, and their sets.

// family is what the rules of one address family need: the nfproto value,
// the header offsets and length of addresses, the set key types and the
// prefix of the names of its chains and sets ("" for IPv4, "v6-").
type family struct {
	nfproto      byte
	saddr, daddr uint32
	alen         uint32
	addrType     nftables.SetDatatype
	prefix       string
}

var (
	ipv4 = family{unix.NFPROTO_IPV4, 12, 16, 4, nftables.TypeIPAddr, ""}
	ipv6 = family{unix.NFPROTO_IPV6, 8, 24, 16, nftables.TypeIP6Addr, "v6-"}
)

func familyOf(p Plan) family {
	if p.V6 {
		return ipv6
	}
	return ipv4
}

// build adds the chains, sets and rules of plans to t, in conn's batch:
//
//	forward (hook forward): ct state established,related accept
//	                        ipv6 neighbour solicitation and advertisement accept
//	                        iifname <pod bridge> ip6 saddr fe80::/10 drop,
//	                        iifname <pod bridge> ip6 daddr fe80::/10 drop
//	                        per family: saddr @egress-isolated jump egress
//	                                    daddr @ingress-isolated jump ingress
//	egress:  one rule per allowing rule, verdict return; then drop
//	ingress: one rule per allowing rule, verdict accept; then drop
//
// The chains and sets of IPv6 have names starting "v6-". While no pod is
// isolated the forward chain is left out, so that the packets the node
// forwards pass no chain of this table: no policy selects a pod, so every
// packet is allowed, link-local traffic between pods too, which is only
// dropped because no policy can name it.
func build(conn *nftables.Conn, t *nftables.Table, plans []Plan) error {
	bridge, err := bridgeOf(plans)
	if err != nil {
		return err
	}
	var fwd *nftables.Chain
	if slices.ContainsFunc(plans, func(p Plan) bool { return len(p.EgressIsolated) > 0 || len(p.IngressIsolated) > 0 }) {
		fwd = conn.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	}
	add := func(c *nftables.Chain, note string, exprs ...[]expr.Any) {
		if c != nil {
			commentedRules(conn, t, c)(note, exprs...)
		}
	}
	add(fwd, "weft: replies and related traffic", ctEstablished(), verdict(expr.VerdictAccept))
	add(fwd, "weft: IPv6 neighbour discovery", isFamily(ipv6), neighbourDiscovery(), verdict(expr.VerdictAccept))
	// Bridged through br_netfilter, a packet's input and output device in
	// the forward hook is the bridge itself: only the pod bridge's.
	fromBridge := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(bridge)},
	}
	add(fwd, "weft: IPv6 link-local between pods", fromBridge, isFamily(ipv6), linkLocal(ipv6.saddr), counted(), verdict(expr.VerdictDrop))
	add(fwd, "weft: IPv6 link-local between pods", fromBridge, isFamily(ipv6), linkLocal(ipv6.daddr), counted(), verdict(expr.VerdictDrop))
	for _, plan := range plans {
		f := familyOf(plan)
		egress := conn.AddChain(&nftables.Chain{Name: f.prefix + "egress", Table: t})
		ingress := conn.AddChain(&nftables.Chain{Name: f.prefix + "ingress", Table: t})
		egIso, err := addrSet(conn, t, f, f.prefix+"egress-isolated", plan.EgressIsolated)
		if err != nil {
			return err
		}
		inIso, err := addrSet(conn, t, f, f.prefix+"ingress-isolated", plan.IngressIsolated)
		if err != nil {
			return err
		}
		add(fwd, "weft: from pods isolated for egress", isFamily(f), lookup(f.field(f.saddr), egIso), jump(egress.Name))
		add(fwd, "weft: to pods isolated for ingress", isFamily(f), lookup(f.field(f.daddr), inIso), jump(ingress.Name))
		for i, r := range plan.Rules {
			c, v := ingress, verdict(expr.VerdictAccept)
			if r.Egress {
				c, v = egress, verdict(expr.VerdictReturn)
			}
			sets, err := ruleSets(conn, t, f, fmt.Sprintf("%sr%d", f.prefix, i), r)
			if err != nil {
				return fmt.Errorf("%s: %w", r.Name, err)
			}
			for _, m := range sets.matches(f, r) {
				add(c, "weft: "+r.Name, m, v)
			}
		}
		if plan.LogGroup != 0 {
			if err := logDrops(conn, t, f, plan, ingress, egress); err != nil {
				return err
			}
		}
		add(egress, "weft: no policy allows it", counted(), verdict(expr.VerdictDrop))
		add(ingress, "weft: no policy allows it", counted(), verdict(expr.VerdictDrop))
	}
	return nil
}

// The drops logged to NFLOG, per family and direction: at most LogRate a
// second, in bursts of LogBurst; the others are dropped unlogged (the
// drop rule's counter still counts them).
const (
	LogRate  = 100
	LogBurst = 50
)

// logDrops adds, before the drops of ingress and egress, a rule that
// jumps (within the rate limit) to a chain logging each packet to
// plan.LogGroup with a prefix that names the policies isolating its pod:
//
//	ingress: ... limit rate LogRate/second burst LogBurst packets jump ingress-log
//	ingress-log: daddr @in-log-0 log group G snaplen 128 prefix "weft drop ingress ns/a"
//	             daddr @in-log-1 log group G snaplen 128 prefix "weft drop ingress ns/a ns/b"
//
// One set and one rule per group of pods the same policies isolate.
func logDrops(conn *nftables.Conn, t *nftables.Table, f family, plan Plan, ingress, egress *nftables.Chain) error {
	for _, d := range []struct {
		dir    string
		chain  *nftables.Chain
		by     []Isolation
		field  uint32
		prefix string
	}{
		{flow.DirIngress, ingress, plan.IngressBy, f.daddr, "in"},
		{flow.DirEgress, egress, plan.EgressBy, f.saddr, "eg"},
	} {
		logc := conn.AddChain(&nftables.Chain{Name: d.chain.Name + "-log", Table: t})
		add := commentedRules(conn, t, logc)
		for i, g := range d.by {
			s, err := addrSet(conn, t, f, fmt.Sprintf("%s%s-log-%d", f.prefix, d.prefix, i), g.Addrs)
			if err != nil {
				return err
			}
			add("weft: log drops", isFamily(f), lookup(f.field(d.field), s), logTo(plan.LogGroup, flow.LogPrefix(d.dir, g.Policies)))
		}
		limit := []expr.Any{&expr.Limit{Type: expr.LimitTypePkts, Rate: LogRate, Unit: expr.LimitTimeSecond, Burst: LogBurst}}
		commentedRules(conn, t, d.chain)("weft: log drops, rate-limited", limit, jump(logc.Name))
	}
	return nil
}

func logTo(group uint16, prefix string) []expr.Any {
	return []expr.Any{&expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX | 1<<unix.NFTA_LOG_SNAPLEN,
		Group: group, Snaplen: flow.SnapLen, Data: []byte(prefix)}}
}

// bridgeOf is the pod bridge the plans name.
func bridgeOf(plans []Plan) (string, error) {
	bridge := ""
	for _, p := range plans {
		if p.Bridge == "" {
			continue
		}
		if bridge != "" && p.Bridge != bridge {
			return "", fmt.Errorf("program network policy: plans name two pod bridges, %s and %s", bridge, p.Bridge)
		}
		bridge = p.Bridge
	}
	if bridge == "" {
		bridge = DefaultBridge
	}
	if len(bridge) >= 16 || strings.ContainsAny(bridge, "/ \x00") {
		return "", fmt.Errorf("program network policy: pod bridge %q: not an interface name", bridge)
	}
	return bridge, nil
}

type ruleSetsOf struct{ local, peers, ports, named *nftables.Set }

// ruleSets adds the sets one rule needs.
func ruleSets(conn *nftables.Conn, t *nftables.Table, f family, prefix string, r Rule) (ruleSetsOf, error) {
	var s ruleSetsOf
	var err error
	if r.Egress || r.AllPorts {
		if s.local, err = addrSet(conn, t, f, prefix+"-local", r.Local); err != nil {
			return s, err
		}
	}
	if !r.AnyPeer && (!r.Egress || r.AllPorts) {
		if s.peers, err = rangeSet(conn, t, f, prefix+"-peers", r.Peers); err != nil {
			return s, err
		}
	}
	if !r.AllPorts {
		if s.ports, err = portSet(conn, t, f, prefix+"-ports", r.Ports); err != nil {
			return s, err
		}
		if len(r.NamedPorts) > 0 {
			if s.named, err = portSet(conn, t, f, prefix+"-named", r.NamedPorts); err != nil {
				return s, err
			}
		}
	}
	return s, nil
}

// matches is the match expressions of r's nftables rules (one or two).
func (s ruleSetsOf) matches(f family, r Rule) [][]expr.Any {
	peer := []expr.Any{}
	if s.peers != nil {
		if r.Egress {
			peer = lookup(f.field(f.daddr), s.peers)
		} else {
			peer = lookup(f.field(f.saddr), s.peers)
		}
	}
	fam := isFamily(f)
	if !r.Egress {
		if r.AllPorts {
			return [][]expr.Any{join(fam, peer, lookup(f.field(f.daddr), s.local))}
		}
		return [][]expr.Any{join(fam, peer, lookup(f.destPort(), s.ports))}
	}
	src := lookup(f.field(f.saddr), s.local)
	if r.AllPorts {
		return [][]expr.Any{join(fam, src, peer)}
	}
	out := [][]expr.Any{join(fam, src, lookup(f.destPort(), s.ports))}
	if s.named != nil {
		out = append(out, join(fam, src, lookup(f.destPort(), s.named)))
	}
	return out
}

func join(es ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, e := range es {
		out = append(out, e...)
	}
	return out
}

func checkFamily(f family, a netip.Addr) error {
	if a.Is4() != (f.alen == 4) {
		return fmt.Errorf("address %s in a set of the other family", a)
	}
	return nil
}

func addrSet(conn *nftables.Conn, t *nftables.Table, f family, name string, addrs []netip.Addr) (*nftables.Set, error) {
	s := &nftables.Set{Table: t, Name: name, KeyType: f.addrType}
	els := make([]nftables.SetElement, 0, len(addrs))
	for _, a := range addrs {
		if err := checkFamily(f, a); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
		els = append(els, nftables.SetElement{Key: a.AsSlice()})
	}
	if err := nft.AddSet(conn, s, els); err != nil {
		return nil, fmt.Errorf("set %s: %w", name, err)
	}
	return s, nil
}

// rangeSet is an interval set of the ranges rs (sorted, disjoint): each
// range is its first address and, unless it reaches the end of the
// address space, the address after its last marked as an interval end.
func rangeSet(conn *nftables.Conn, t *nftables.Table, f family, name string, rs []Range) (*nftables.Set, error) {
	s := &nftables.Set{Table: t, Name: name, KeyType: f.addrType, Interval: true}
	var els []nftables.SetElement
	for _, r := range rs {
		if err := errors.Join(checkFamily(f, r.First), checkFamily(f, r.Last)); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
		els = append(els, nftables.SetElement{Key: r.First.AsSlice()})
		if end := r.Last.Next(); end.IsValid() {
			els = append(els, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	if err := nft.AddSet(conn, s, els); err != nil {
		return nil, fmt.Errorf("set %s: %w", name, err)
	}
	return s, nil
}

// portSet is a set of daddr . meta l4proto . th dport ranges.
func portSet(conn *nftables.Conn, t *nftables.Table, f family, name string, es []PortEntry) (*nftables.Set, error) {
	s := &nftables.Set{Table: t, Name: name, Interval: true, Concatenation: true,
		KeyType: nftables.MustConcatSetType(f.addrType, nftables.TypeInetProto, nftables.TypeInetService)}
	els := make([]nftables.SetElement, 0, len(es))
	for _, e := range es {
		if err := errors.Join(checkFamily(f, e.Addr.First), checkFamily(f, e.Addr.Last)); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
		els = append(els, nftables.SetElement{Key: portKey(e.Addr.First, e.Proto, e.First), KeyEnd: portKey(e.Addr.Last, e.Proto, e.Last)})
	}
	if err := nft.AddSet(conn, s, els); err != nil {
		return nil, fmt.Errorf("set %s: %w", name, err)
	}
	return s, nil
}

// portKey is a key of the concatenation: the address, then the protocol
// and the port in 4 bytes each.
func portKey(a netip.Addr, proto uint8, port uint16) []byte {
	b := a.AsSlice()
	k := make([]byte, len(b)+8)
	copy(k, b)
	k[len(b)] = proto
	binary.BigEndian.PutUint16(k[len(b)+4:], port)
	return k
}

// field loads the address at offset off of the network header into
// register 1.
func (f family) field(off uint32) []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: f.alen}}
}

// destPort loads daddr . meta l4proto . th dport into the 32-bit registers
// from register 1 on (register 1 is the 32-bit registers 8 to 11).
func (f family) destPort() []expr.Any {
	next := 8 + f.alen/4
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.daddr, Len: f.alen},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: next},
		&expr.Payload{DestRegister: next + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
	}
}

// isFamily matches the packets of f (meta nfproto).
func isFamily(f family) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.nfproto}},
	}
}

// linkLocal matches an IPv6 address at off in fe80::/10.
func linkLocal(off uint32) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 2},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 2, Mask: []byte{0xff, 0xc0}, Xor: []byte{0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0xfe, 0x80}},
	}
}

// neighbourDiscovery matches ICMPv6 neighbour solicitations and
// advertisements (types 135 and 136), which pods need to reach each
// other's IPv6 addresses at all, as ARP for IPv4.
func neighbourDiscovery() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: []byte{135}, ToData: []byte{136}},
	}
}

func counted() []expr.Any { return []expr.Any{&expr.Counter{}} }

func lookup(load []expr.Any, s *nftables.Set) []expr.Any {
	return append(load, &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID})
}

func ctEstablished() []expr.Any {
	mask := binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED)
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }
func jump(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}
