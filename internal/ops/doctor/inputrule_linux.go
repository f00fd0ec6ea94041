package doctor

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
)

// ruleMatch is what a rule matches in a UDP datagram of a family to the
// port, and what it does with it.
type ruleMatch struct {
	excluded  bool         // it matches no such datagram: the other family, another protocol or port
	verdict   string       // "accept", "drop" (or reject), "return", "" for none or another
	jump      string       // the chain it jumps or goes to
	isGoto    bool         // it goes to jump rather than jumping
	vmap      bool         // a verdict map (a lookup writing the verdict) decides
	ctMap     string       // the verdict map's name when it is keyed on ct state alone
	portSet   string       // the set a lookup of the destination port is in (udp dport { 8472, 22 })
	matches   int          // compares, besides the family's
	portMatch bool         // it matches the port
	other     bool         // a match besides the protocol and the port
	narrow    bool         // one that may leave out some peers' datagrams
	from      netip.Prefix // the one source prefix it is limited to
	notFrom   netip.Prefix // the one source prefix it leaves out (ip saddr != P)
	sources   int          // source address compares
	extra     bool         // a match besides the family, UDP, the port and sources
	opaque    bool         // a match doctor does not evaluate (a mark, a set lookup), besides interfaces and ct state
}

// sourceOnly is the one source prefix a rule is limited to (not: to the
// sources outside it) when that is all it matches of the family's UDP
// datagrams to the port; ok is false when it matches anything else.
func (m ruleMatch) sourceOnly() (p netip.Prefix, not, ok bool) {
	if m.extra || m.sources != 1 {
		return netip.Prefix{}, false, false
	}
	if m.notFrom.IsValid() {
		return m.notFrom, true, true
	}
	return m.from, false, m.from.IsValid()
}

// unconditional is true when a rule matches every UDP datagram of the
// family to the port.
func (m ruleMatch) unconditional() bool { return !m.extra && m.sources == 0 }

// decides says what a rule does with a UDP datagram of the family to
// the port: "accept" when it accepts everything, or matches the port (and
// UDP, if it names a protocol) and nothing narrower and accepts; "drop"
// when it drops or rejects everything, or the port and nothing else; ""
// when it does not decide for every peer's datagrams. An accept limited
// to one source prefix (`ip saddr 192.168.77.0/24 udp dport 8472
// accept`, or with no port: the underlay trusted) is "accept" from that
// prefix (from is invalid for an accept from everywhere); one limited to
// interfaces or marks, or to a set of sources, leaves the peers to the
// rules after it and the policy. A conntrack state match that includes
// new (firewalld's `ct state new,untracked`) does not narrow an accept:
// VXLAN's hashed source ports open new flows, and the chains that use it
// accept established ones before. A drop with any other match does not
// decide (conntrack state does not cover VXLAN's hashed source ports).
func (m ruleMatch) decides() (verdict string, from netip.Prefix) {
	switch {
	case m.excluded:
	case m.matches == 0 && !m.other:
		return m.verdict, netip.Prefix{} // accepts or drops everything
	case m.verdict == "accept" && !m.narrow && (m.portMatch || m.from.IsValid()):
		return "accept", m.from
	case m.portMatch && m.verdict == "drop" && !m.other:
		return "drop", netip.Prefix{}
	}
	return "", netip.Prefix{}
}

// matchRule reads what a rule matches in a UDP datagram of a family (IPv6
// when v6) to port. A family match (meta nfproto, meta protocol) that
// excludesFamily did not rule out matches the family, unless it compares
// by order (`meta nfproto > ipv4`): that one narrows.
func matchRule(r *nftables.Rule, v6 bool, port uint16) ruleMatch {
	m := ruleMatch{excluded: excludesFamily(r.Exprs, v6)}
	if m.excluded {
		return m
	}
	var (
		load   = loadNone // what the last load put in a register
		ctMask uint32
		mask   []byte // the mask applied to a loaded source address
	)
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Counter, *expr.Log:
		case *expr.Meta, *expr.Payload, *expr.Ct:
			load, mask, ctMask = loadOf(e, v6), nil, ^uint32(0)
		case *expr.Bitwise:
			switch {
			case load == loadCtState && len(e.Mask) == 4:
				ctMask &= binary.NativeEndian.Uint32(e.Mask)
			case load == loadSaddr && mask == nil && allZero(e.Xor):
				mask = e.Mask
			default:
				load = loadOther
			}
		case *expr.Cmp:
			if load == loadFamily && (e.Op == expr.CmpOpEq || e.Op == expr.CmpOpNeq) {
				load = loadNone
				continue
			}
			m.matches++
			if !m.compare(e, load, ctMask, mask, v6, port) {
				return ruleMatch{excluded: true}
			}
			load = loadNone
		case *expr.Lookup:
			if e.IsDestRegSet && e.DestRegister == 0 && load == loadCtState && ctMask == ^uint32(0) {
				m.vmap, m.ctMap = true, e.SetName // ct state vmap { ... }: resolved by the walk
				continue
			}
			if !e.IsDestRegSet && !e.Invert && load == loadDport && m.portSet == "" {
				m.portSet, load = e.SetName, loadNone // resolved by the walk
				m.matches++
				continue
			}
			m.statement(e)
		default:
			m.statement(e)
		}
	}
	return m
}

// statement adds to m what an expression other than a load, a bitwise
// operation or a compare does: a verdict (or a reject, iptables-nft's
// REJECT and DROP targets, a verdict map), or a match of another kind
// (a set lookup, a range, an xtables match that passesInput does not
// pass), which narrows the rule.
func (m *ruleMatch) statement(e expr.Any) {
	switch e := e.(type) {
	case *expr.Verdict:
		switch e.Kind {
		case expr.VerdictAccept:
			m.verdict = "accept"
		case expr.VerdictDrop:
			m.verdict = "drop"
		case expr.VerdictReturn:
			m.verdict = "return"
		case expr.VerdictJump, expr.VerdictGoto:
			m.jump, m.isGoto = e.Chain, e.Kind == expr.VerdictGoto
		}
		return
	case *expr.Reject:
		m.verdict = "drop"
		return
	case *expr.Target:
		if e.Name == "REJECT" || e.Name == "DROP" {
			m.verdict = "drop"
			return
		}
	case *expr.Match:
		if passesInput(e) {
			return
		}
		if newState(e) {
			m.other, m.extra = true, true // as a native ct state match with new
			return
		}
	case *expr.Lookup:
		m.vmap = m.vmap || e.IsDestRegSet && e.DestRegister == 0 // udp dport vmap { 8472 : drop }
	}
	m.other, m.narrow, m.extra, m.opaque = true, true, true, true
}

// passesInput is true for an xtables match that every datagram of the
// overlay on the input hook passes: a comment, or an address type match
// of the destination alone that includes local addresses (the datagrams
// are unicast to the node's address: ufw-not-local's `-m addrtype
// --dst-type LOCAL -j RETURN`).
func passesInput(e *expr.Match) bool {
	const invertDest = 2 // XT_ADDRTYPE_INVERT_DEST
	switch i := e.Info.(type) {
	case *xt.Comment:
		return true
	case *xt.AddrType:
		return i.Source == 0 && !i.InvertDest && i.Dest&uint16(xt.AddrTypeLocal) != 0
	case *xt.AddrTypeV1:
		return i.Source == 0 && i.Flags&invertDest == 0 && i.Dest&uint16(xt.AddrTypeLocal) != 0
	}
	return false
}

// newState is true for an xtables conntrack match of states alone
// (iptables-nft's -m state --state and -m conntrack --ctstate, both the
// conntrack match) whose states include new: like a native `ct state`
// with new, it does not narrow an accept of the overlay's datagrams
// (see ruleMatch.decides). The state bits are conntrack's, as in `ct
// state`.
func newState(e *expr.Match) bool {
	var (
		base  *xt.ConntrackMtinfoBase
		state uint16
	)
	switch i := e.Info.(type) {
	case *xt.ConntrackMtinfo1:
		base, state = &i.ConntrackMtinfoBase, uint16(i.StateMask)
	case *xt.ConntrackMtinfo2:
		base, state = &i.ConntrackMtinfoBase, i.StateMask
	case *xt.ConntrackMtinfo3:
		base, state = &i.ConntrackMtinfoBase, i.StateMask
	case *xt.Unknown: // the state match itself (xt_state_info: a statemask)
		return e.Name == "state" && len(*i) == 4 && binary.NativeEndian.Uint32(*i)&ctStateNew != 0
	default:
		return false
	}
	return base.MatchFlags&^uint16(xt.ConntrackState|xt.ConntrackStateAlias) == 0 && base.MatchFlags&uint16(xt.ConntrackState) != 0 &&
		base.InvertFlags&uint16(xt.ConntrackState) == 0 && uint32(state)&ctStateNew != 0
}

// compare adds a compare of what load put in a register to m; it returns
// false when the compare rules out the datagrams (another protocol or
// port).
func (m *ruleMatch) compare(e *expr.Cmp, load int, ctMask uint32, mask []byte, v6 bool, port uint16) bool {
	switch load {
	case loadProto, loadDport:
		want := []byte{17}
		if load == loadDport {
			want = binary.BigEndian.AppendUint16(nil, port)
		}
		switch {
		case e.Op == expr.CmpOpEq && string(e.Data) != string(want):
			return false
		case e.Op == expr.CmpOpEq:
			m.portMatch = m.portMatch || load == loadDport
		default: // udp dport != 53, a range
			m.other, m.narrow, m.extra = true, true, true
		}
	case loadCtState:
		m.other, m.extra = true, true
		m.narrow = m.narrow || e.Op != expr.CmpOpNeq || !allZero(e.Data) || ctMask&ctStateNew == 0
	case loadSaddr:
		m.other = true
		m.sources++
		p, ok := sourcePrefix(e.Data, mask, v6)
		switch {
		case !ok || e.Op != expr.CmpOpEq && e.Op != expr.CmpOpNeq:
			m.narrow, m.extra = true, true
		case e.Op == expr.CmpOpNeq:
			m.narrow, m.notFrom = true, p
		case m.from.IsValid():
			m.narrow = true // a second source match
		default:
			m.from = p
		}
	case loadIface: // taken to be the underlay's (firewalld's interface zones)
		m.other, m.narrow, m.extra = true, true, true
	default:
		m.other, m.narrow, m.extra, m.opaque = true, true, true, true
	}
	return true
}

// What a rule's load expression put in a register, for matchRule.
const (
	loadNone    = iota
	loadOther   // something matchRule does not tell apart
	loadFamily  // the packet's family: excludesFamily matched it
	loadProto   // the layer-4 protocol
	loadDport   // the transport destination port
	loadCtState // conntrack's state bits
	loadSaddr   // the network source address
	loadIface   // the input interface (iifname, iif)
)

// loadOf is what a meta, payload or ct expression loads, in the header of
// the evaluated family (IPv6 when v6).
func loadOf(e expr.Any, v6 bool) int {
	switch e := e.(type) {
	case *expr.Meta:
		switch {
		case e.Key == expr.MetaKeyL4PROTO:
			return loadProto
		case familyLoad(e):
			return loadFamily
		case e.Key == expr.MetaKeyIIFNAME || e.Key == expr.MetaKeyIIF:
			return loadIface
		}
	case *expr.Payload:
		switch proto, saddr := networkField(e, v6); {
		case e.Base == expr.PayloadBaseNetworkHeader && proto:
			return loadProto
		case e.Base == expr.PayloadBaseNetworkHeader && saddr:
			return loadSaddr
		case e.Base == expr.PayloadBaseTransportHeader && e.Offset == 2 && e.Len == 2:
			return loadDport
		}
	case *expr.Ct:
		if e.Key == expr.CtKeySTATE {
			return loadCtState
		}
	}
	return loadOther
}

// ctStateNew is conntrack's new state bit in `ct state` (IP_CT_NEW's).
const ctStateNew = 1 << 3

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// describeRule names a dropping rule by what it matched and its handle.
func describeRule(r *nftables.Rule, port uint16) string {
	for _, e := range r.Exprs {
		if p, ok := e.(*expr.Payload); ok && p.Base == expr.PayloadBaseTransportHeader {
			return fmt.Sprintf("udp dport %d drop (handle %d)", port, r.Handle)
		}
	}
	return fmt.Sprintf("drop, matching every packet (handle %d)", r.Handle)
}
