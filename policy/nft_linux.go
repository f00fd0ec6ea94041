package policy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Table is the nftables table (family inet: IPv4 and IPv6) that holds the
// policy rules.
const Table = "weft-policy"

// DefaultBridge is the pod bridge of a plan that names none: the CNI
// plugin's default.
const DefaultBridge = "cni0"

// ErrNoSourceChecks says that Program committed the inet table but not
// the bridge table of the source checks, which the kernel refused (as one
// without nftables' bridge family, CONFIG_NF_TABLES_BRIDGE, does): policy
// is enforced, but not the checks of that table.
var ErrNoSourceChecks = errors.New("bridge table refused: pods' source addresses, and broadcasts to pods isolated for ingress, are not checked")

// Program replaces the policy table in the namespace at netns ("" for the
// current one) by the one plans describe (at most one plan per family), in
// one nftables transaction: the kernel switches from the old rules to the
// new ones at once; when a plan lists pods' bridge ports, the bridge table
// of their source checks (buildAntiSpoof) is replaced in the same
// transaction. If the kernel refuses that transaction but takes the inet
// table alone, Program commits the inet table alone and returns an error
// wrapping ErrNoSourceChecks. IPv6 packets with a link-local source or
// destination that the pod bridge forwards (pods of one node bridging to
// each other through br_netfilter) are dropped whatever the plans, except
// neighbour discovery; other bridges of the node are not touched.
func Program(netns string, plans ...Plan) error {
	if len(plans) > 2 || len(plans) == 2 && plans[0].V6 == plans[1].V6 {
		return errors.New("program network policy: more than one plan of a family")
	}
	// Only with ports: a node run without the address store needs no
	// bridge table to enforce the rest. A table left with no ports
	// listed stays: its entries name veths that are gone.
	withBridge := slices.ContainsFunc(plans, func(p Plan) bool { return len(p.Ports) > 0 })
	err := program(netns, plans, withBridge)
	if err == nil || !withBridge {
		return err
	}
	if errInet := program(netns, plans, false); errInet != nil {
		return err // the inet table is refused too: the first error says why
	}
	// A bridge table of an earlier commit would go on applying old ports
	// and isolation: it goes, where the kernel lets it.
	if derr := delBridge(netns); derr != nil {
		return fmt.Errorf("%w: %w (and an earlier bridge table may be left in place: %w)", ErrNoSourceChecks, err, derr)
	}
	return fmt.Errorf("%w: %w", ErrNoSourceChecks, err)
}

// delBridge deletes the bridge table, if there is one.
func delBridge(netns string) error {
	conn, closeNS, err := dial(netns)
	if err != nil {
		return err
	}
	defer closeNS()
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyBridge)
	if err != nil {
		return nil // no bridge family: no table of it either
	}
	for _, t := range tables {
		if t.Name == Table {
			conn.DelTable(t)
			return conn.Flush()
		}
	}
	return nil
}

// program writes the inet table of plans and, if withBridge, their bridge
// table, in one transaction.
func program(netns string, plans []Plan, withBridge bool) error {
	conn, closeNS, err := dial(netns)
	if err != nil {
		return err
	}
	defer closeNS()
	old := &nftables.Table{Name: Table, Family: nftables.TableFamilyIPv4} // earlier releases' table
	conn.AddTable(old)
	conn.DelTable(old)
	t := &nftables.Table{Name: Table, Family: nftables.TableFamilyINet}
	conn.AddTable(t) // so that the delete below finds it
	conn.DelTable(t)
	conn.AddTable(t)
	if err := build(conn, t, plans); err != nil {
		return err
	}
	if withBridge {
		bt := &nftables.Table{Name: Table, Family: nftables.TableFamilyBridge}
		conn.AddTable(bt)
		conn.DelTable(bt)
		conn.AddTable(bt)
		if err := buildAntiSpoof(conn, bt, plans); err != nil {
			return err
		}
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("program nftables table %s: %w", Table, err)
	}
	return nil
}

// Remove deletes the policy tables (and an earlier release's IPv4-only
// one), if they are there.
func Remove(netns string) error {
	conn, closeNS, err := dial(netns)
	if err != nil {
		return err
	}
	defer closeNS()
	// One transaction each: a kernel without the bridge family refuses
	// that one only.
	var errs []error
	for _, f := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyINet, nftables.TableFamilyBridge} {
		t := &nftables.Table{Name: Table, Family: f}
		conn.AddTable(t)
		conn.DelTable(t)
		if err := conn.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("remove nftables table %s (family %d): %w", Table, f, err))
		}
	}
	return errors.Join(errs...)
}

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
// The chains and sets of IPv6 have names starting "v6-".
func build(conn *nftables.Conn, t *nftables.Table, plans []Plan) error {
	bridge, err := bridgeOf(plans)
	if err != nil {
		return err
	}
	fwd := conn.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	add := func(c *nftables.Chain, note string, exprs ...[]expr.Any) { commentedRules(conn, t, c)(note, exprs...) }
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
		add(egress, "weft: no policy allows it", counted(), verdict(expr.VerdictDrop))
		add(ingress, "weft: no policy allows it", counted(), verdict(expr.VerdictDrop))
	}
	return nil
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
	if err := conn.AddSet(s, els); err != nil {
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
	if err := conn.AddSet(s, els); err != nil {
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
	if err := conn.AddSet(s, els); err != nil {
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

// buildAntiSpoof adds to t (family bridge, hook prerouting) the source
// checks of the pods' bridge ports in plans' Ports: a frame from one of
// those ports is dropped when it is
//
//	ARP with a sender address (not 0.0.0.0) that is not its port's,
//	IPv4 with a source address that is not its port's,
//	IPv6 with a source address that is not its port's, link-local or ::,
//	802.1Q or 802.1ad tagged (no pod needs them; they would carry packets
//	past the checks).
//
// Ports not listed (another plugin's veths, the bridge's other ports) are
// not checked.
func buildAntiSpoof(conn *nftables.Conn, t *nftables.Table, plans []Plan) error {
	c := conn.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityFilter})
	ports := &nftables.Set{Table: t, Name: "pod-ports", KeyType: nftables.TypeIFName}
	v4 := &nftables.Set{Table: t, Name: "pod-addrs", Concatenation: true, KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)}
	v6 := &nftables.Set{Table: t, Name: "v6-pod-addrs", Concatenation: true, KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIP6Addr)}
	seen := map[string]bool{}
	var portEls, v4Els, v6Els []nftables.SetElement
	for _, p := range plans {
		for _, pp := range p.Ports {
			if len(pp.Port) >= 16 || pp.Port == "" {
				return fmt.Errorf("bridge port %q: not an interface name", pp.Port)
			}
			if pp.Addr.Is4() == p.V6 {
				return fmt.Errorf("bridge port %s: address %s in the plan of the other family", pp.Port, pp.Addr)
			}
			if !seen[pp.Port] {
				seen[pp.Port] = true
				portEls = append(portEls, nftables.SetElement{Key: ifname(pp.Port)})
			}
			el := nftables.SetElement{Key: append(ifname(pp.Port), pp.Addr.AsSlice()...)}
			if p.V6 {
				v6Els = append(v6Els, el)
			} else {
				v4Els = append(v4Els, el)
			}
		}
	}
	for _, x := range []struct {
		s   *nftables.Set
		els []nftables.SetElement
	}{{ports, portEls}, {v4, v4Els}, {v6, v6Els}} {
		if err := conn.AddSet(x.s, x.els); err != nil {
			return fmt.Errorf("set %s: %w", x.s.Name, err)
		}
	}
	add := commentedRules(conn, t, c)
	fromPod := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: ports.Name, SetID: ports.ID},
	}
	notPortAddr := func(off, n uint32, s *nftables.Set) []expr.Any { return portAddrNotIn(expr.MetaKeyIIFNAME, off, n, s) }
	drop := join(counted(), verdict(expr.VerdictDrop))
	add("weft: ARP sender not the pod's", fromPod, etherType(unix.ETH_P_ARP),
		[]expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 14, Len: 4},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
		}, notPortAddr(14, 4, v4), drop)
	add("weft: IPv4 source not the pod's", fromPod, etherType(unix.ETH_P_IP), notPortAddr(12, 4, v4), drop)
	add("weft: IPv6 link-local or unspecified source", fromPod, etherType(unix.ETH_P_IPV6), linkLocal(ipv6.saddr), verdict(expr.VerdictAccept))
	add("weft: IPv6 link-local or unspecified source", fromPod, etherType(unix.ETH_P_IPV6),
		[]expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ipv6.saddr, Len: 16},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: make([]byte, 16)},
		}, verdict(expr.VerdictAccept))
	add("weft: IPv6 source not the pod's", fromPod, etherType(unix.ETH_P_IPV6), notPortAddr(ipv6.saddr, 16, v6), drop)
	add("weft: VLAN-tagged frame from a pod", fromPod, etherType(unix.ETH_P_8021Q), drop)
	add("weft: VLAN-tagged frame from a pod", fromPod, etherType(unix.ETH_P_8021AD), drop)
	return isolateBroadcast(conn, t, plans, v4, v6)
}

// isolateBroadcast adds to t (family bridge) a chain on the forward hook,
// where a frame that the bridge sends out of one port to another (the
// flooded copies of a broadcast or multicast frame each pass it, with the
// port they leave by) is dropped when it goes to the port of a pod
// isolated for ingress and its IPv4 or IPv6 destination is not that pod's
// address (in pod-addrs, v6-pod-addrs): broadcasts, multicast and any
// other packet the pod would take without being its destination, which
// the inet table's ingress check (by destination address) never matches.
// ARP and IPv6 neighbour solicitations and advertisements pass.
func isolateBroadcast(conn *nftables.Conn, t *nftables.Table, plans []Plan, v4, v6 *nftables.Set) error {
	iso := &nftables.Set{Table: t, Name: "ingress-isolated-ports", KeyType: nftables.TypeIFName}
	var els []nftables.SetElement
	seen := map[string]bool{}
	for _, p := range plans {
		for _, pp := range p.Ports {
			if !seen[pp.Port] && slices.Contains(p.IngressIsolated, pp.Addr) {
				seen[pp.Port] = true
				els = append(els, nftables.SetElement{Key: ifname(pp.Port)})
			}
		}
	}
	if err := conn.AddSet(iso, els); err != nil {
		return fmt.Errorf("set %s: %w", iso.Name, err)
	}
	c := conn.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	add := commentedRules(conn, t, c)
	toIsolated := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: iso.Name, SetID: iso.ID},
	}
	notPortDest := func(off, n uint32, s *nftables.Set) []expr.Any { return portAddrNotIn(expr.MetaKeyOIFNAME, off, n, s) }
	drop := join(counted(), verdict(expr.VerdictDrop))
	add("weft: to a pod isolated for ingress, not its IPv4 address", toIsolated, etherType(unix.ETH_P_IP), notPortDest(ipv4.daddr, 4, v4), drop)
	add("weft: IPv6 neighbour discovery", toIsolated, etherType(unix.ETH_P_IPV6), neighbourDiscovery(), verdict(expr.VerdictAccept))
	add("weft: to a pod isolated for ingress, not its IPv6 address", toIsolated, etherType(unix.ETH_P_IPV6), notPortDest(ipv6.daddr, 16, v6), drop)
	return nil
}

// commentedRules returns a function that appends to chain c of t a rule
// made of exprs, with note as its comment.
func commentedRules(conn *nftables.Conn, t *nftables.Table, c *nftables.Chain) func(note string, exprs ...[]expr.Any) {
	return func(note string, exprs ...[]expr.Any) {
		conn.AddRule(&nftables.Rule{Table: t, Chain: c, Exprs: join(exprs...), UserData: userdata.AppendString(nil, userdata.TypeComment, note)})
	}
}

// etherType matches frames of EtherType typ (bridge family).
func etherType(typ uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 12, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(typ)},
	}
}

// portAddrNotIn matches when the port (the input or output interface,
// key) . the address at off (len n) of the network header is not in s.
func portAddrNotIn(key expr.MetaKey, off, n uint32, s *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Payload{DestRegister: 2, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID, Invert: true},
	}
}

// ifname is an interface name as nftables keys hold it: 16 bytes, zero
// padded.
func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}

// sendBuffer is the socket buffer size (send and receive) of the nftables
// connection: one transaction goes in one sendmsg, which the default
// buffer (wmem_default, about 200 KiB) limits to some thousand pods, and
// the kernel's answers to it come back at once; nft(8) raises both too.
const sendBuffer = 64 << 20

func bigBuffer(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("nftables socket: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = errors.Join(unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sendBuffer),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, sendBuffer))
	}); err != nil {
		return fmt.Errorf("nftables socket: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("nftables socket send buffer: %w", serr)
	}
	return nil
}

// dial returns an nftables connection to the namespace at path ("" for the
// current one) and the function that releases it.
func dial(path string) (*nftables.Conn, func(), error) {
	buf := nftables.WithSockOptions(bigBuffer)
	if path == "" {
		c, err := nftables.New(buf)
		if err != nil {
			return nil, nil, fmt.Errorf("nftables connection: %w", err)
		}
		return c, func() {}, nil
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open namespace %s: %w", path, err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(fd), buf)
	if err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("nftables connection in %s: %w", path, err)
	}
	return c, func() { unix.Close(fd) }, nil
}

// ErrNoBridgeNetfilter says br_netfilter is not loaded: traffic between
// two pods of the node crosses the bridge unseen by the policy rules, and
// weftd does not load kernel modules.
var ErrNoBridgeNetfilter = errors.New("br_netfilter is not loaded, so traffic between pods of this node would bypass network policy " +
	"(load it: modprobe br_netfilter, or turn policy off: --network-policy=false)")

// EnsureBridgeNetfilter makes bridged IPv4 and IPv6 traffic pass the
// forward hook in the network namespace of the calling thread, as policy
// needs for the traffic between pods of one node: it sets
// net.bridge.bridge-nf-call-iptables and -ip6tables to 1 under procSys
// (normally /proc/sys; they are settings of each network namespace since
// Linux 5.3). It returns ErrNoBridgeNetfilter when br_netfilter is not
// loaded, and which settings it changed.
func EnsureBridgeNetfilter(procSys string) (changed []string, err error) {
	for _, name := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables"} {
		path := procSys + "/net/bridge/" + name
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			return changed, ErrNoBridgeNetfilter
		}
		if err != nil {
			return changed, fmt.Errorf("network policy: %w", err)
		}
		if len(b) > 0 && b[0] == '1' {
			continue
		}
		if err := os.WriteFile(path, []byte("1\n"), 0o644); err != nil {
			return changed, fmt.Errorf("network policy: set net.bridge.%s=1, without which traffic between pods of this node bypasses policy: %w", name, err)
		}
		changed = append(changed, "net.bridge."+name)
	}
	return changed, nil
}
