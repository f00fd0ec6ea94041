package doctor

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/subnet"
)

// tunnelPort is the UDP port the overlay's packets arrive on, by backend
// type; ok is false for backends without one (host-gw and the others).
func tunnelPort(cfg *subnet.Config) (port int, name string, ok bool) {
	switch cfg.Backend.Type {
	case subnet.BackendTypeVXLAN, subnet.BackendTypeUVXLAN:
		return cfg.Backend.Port, "VXLAN", true
	case subnet.BackendTypeWireGuard:
		return cfg.Backend.ListenPort, "WireGuard", true
	}
	return 0, "", false
}

// portVerdict is what an input chain does with the overlay's UDP
// datagrams of one underlay family: accept, drop (by a rule, named in
// rule, or by the policy), or nothing said (the next hook or the default
// accept).
type portVerdict struct {
	chain  dropChain
	family underlayFamily
	drops  bool
	rule   string // the rule that decided, in nft's words; "" for the policy
	policy bool   // the chain's policy is drop
	// uncovered are the peers that rules accepting the port from some
	// sources only left out (nil when no such rule came first).
	uncovered []underlayPeer
	both      bool // the same verdict holds for IPv4 and IPv6
}

// checkInput looks for nftables chains on the input hook (native ones and
// iptables-nft's INPUT and ip6tables-nft's) that drop the overlay's UDP
// port, for each underlay family of the node (see underlayFamilies): in
// ip tables for IPv4, ip6 tables for IPv6, inet tables for both, where a
// rule's family match (meta nfproto) limits it to one. A chain drops
// the port by a rule that drops or rejects datagrams to it, or by a policy
// drop that no rule before it overrides with an accept of the port from
// every peer: from everywhere, or from sources that together hold every
// peer's underlay address of the family (see portRule). Such a chain
// drops every VXLAN or WireGuard datagram from the peers, whatever weft
// programs: a failure. With uvxlan's fast path attached it drops only the
// datagrams of peers on the userspace path (the fast path takes the others
// before netfilter): a warning. iptables-legacy's INPUT is not read.
func checkInput(s *state) {
	if s.Config == nil {
		return
	}
	port, what, ok := tunnelPort(s.Config)
	if !ok {
		return
	}
	families := s.underlayFamilies(port)
	found, err := s.inputVerdicts(families)
	if err != nil {
		s.r.add("firewall/input", Warn, "", "read nftables chains: %v", err)
		return
	}
	sc := s.inputDropScope(what)
	for _, v := range found {
		s.reportInput(v, len(families) > 1, what, sc)
	}
	if len(found) == 0 {
		fams := make([]string, len(families))
		for i, f := range families {
			fams[i] = f.String()
		}
		on := ""
		if len(families) > 1 || families[0].v6 {
			on = " over " + strings.Join(fams, " and ")
		}
		s.r.ok("firewall/input", "no input chain drops UDP %d (%s)%s", port, what, on)
	}
}

// inputVerdicts walks each filter chain on the input hook for each family
// whose datagrams it sees and returns the verdicts that drop the port.
func (s *state) inputVerdicts(families []underlayFamily) ([]portVerdict, error) {
	var found []portVerdict
	err := s.hookChains(nftables.ChainHookInput, func(c *nftables.Conn, ch *nftables.Chain) error {
		if ch.Type != nftables.ChainTypeFilter {
			return nil
		}
		for _, f := range families {
			if !f.applies(ch.Table.Family) {
				continue
			}
			v := portVerdict{chain: dropChain{family: ch.Table.Family, table: ch.Table.Name, name: ch.Name}, family: f,
				policy: ch.Policy != nil && *ch.Policy == nftables.ChainPolicyDrop}
			w := &inputWalk{c: c, t: ch.Table, f: f, open: f.peers}
			decided, err := w.chainVerdict(ch.Name, &v, 0)
			if err != nil {
				return err
			}
			if !decided && v.policy {
				v.drops = true
			}
			if v.drops {
				v.uncovered = w.uncovered()
				found = mergeFamilies(found, v)
			}
		}
		return nil
	})
	return found, err
}

// reportInput reports a chain that drops the port, with the fix: an accept
// of the port, or of the peers that accepts by source left out. The
// family is named on a dual-stack or IPv6 node (dual: the node has both).
func (s *state) reportInput(v portVerdict, dual bool, what string, sc dropScope) {
	over := ""
	switch {
	case v.both:
		over = " over IPv4 and IPv6"
	case dual || v.family.v6:
		over = " over " + v.family.String()
	}
	fix := fmt.Sprintf("nft insert rule %s %s %s udp dport %d accept", familyName(v.chain.family), v.chain.table, v.chain.name, v.family.port)
	if iptablesInput(v.chain) {
		fix = fmt.Sprintf("%s -I INPUT -p udp --dport %d -j ACCEPT", map[bool]string{false: "iptables", true: "ip6tables"}[v.chain.family == nftables.TableFamilyIPv6], v.family.port)
	}
	if len(v.uncovered) > 0 {
		fix = acceptSources(v)
	}
	if v.rule != "" {
		left := ""
		if len(v.uncovered) > 0 {
			left = fmt.Sprintf(" (rules before it accept UDP %d only from sources that leave out %s)", v.family.port, peerList(v.uncovered))
		}
		s.r.add("firewall/input", sc.status, "delete that rule, or "+fix,
			"%s drops UDP %d%s (%s, %s) by rule %q%s%s", v.chain, v.family.port, over, what, sc.whom, v.rule, left, sc.bypass)
		return
	}
	left := ""
	if len(v.uncovered) > 0 {
		left = fmt.Sprintf(" (rules accept it only from sources that leave out %s)", peerList(v.uncovered))
	}
	s.r.add("firewall/input", sc.status, fix,
		"%s has policy drop and no rule accepting UDP %d%s from every peer%s: %s that no rule accepts are dropped there, whatever other tables accept%s",
		v.chain, v.family.port, over, left, sc.dropped, sc.bypass)
}

// mergeFamilies adds v to found, or marks the verdict found for the other
// family in the same chain as holding for both when it is the same.
func mergeFamilies(found []portVerdict, v portVerdict) []portVerdict {
	for i, o := range found {
		if o.chain == v.chain && o.family.v6 != v.family.v6 && o.family.port == v.family.port && o.rule == v.rule &&
			len(o.uncovered) == 0 && len(v.uncovered) == 0 {
			found[i].both = true
			return found
		}
	}
	return append(found, v)
}

func peerList(ps []underlayPeer) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	word := "peer "
	if len(ps) > 1 {
		word = "peers "
	}
	return word + strings.Join(s, ", ")
}

// dropScope is whose datagrams an input chain dropping the tunnel port
// cuts off, in the report's words, and how severe that is.
type dropScope struct {
	status  Status
	whom    string // "every VXLAN datagram from the peers"
	dropped string // "the VXLAN datagrams"
	bypass  string // "" or why some peers' datagrams still arrive
}

// inputDropScope: every peer's datagrams (a failure), unless uvxlan's fast
// path has its ingress program on the underlay, which takes the datagrams
// of the peers in its map before netfilter, so that the chain cuts off
// only peers on the userspace path (a warning). A node runs uvxlan by its
// network config or by weftd's --backend: the TAP device and the program
// tell, not the config.
func (s *state) inputDropScope(what string) dropScope {
	sc := dropScope{status: Fail, whom: "every " + what + " datagram from the peers", dropped: "the " + what + " datagrams"}
	if fp, err := s.fastPath(); err == nil && fp.Ingress {
		sc.status, sc.whom = Warn, "the datagrams of peers on the userspace path"
		sc.dropped += " of peers on the userspace path"
		sc.bypass = fmt.Sprintf("; the fast path (%s on the underlay's ingress) takes the datagrams of the peers it carries before this hook, so they still arrive", inspect.FastIngressProgram)
	}
	return sc
}

// inputWalk follows one family's datagrams through the chains of a table.
type inputWalk struct {
	c        *nftables.Conn
	t        *nftables.Table
	f        underlayFamily
	open     []underlayPeer // the peers no rule has accepted yet
	bySource bool           // a rule accepted the port from some sources only
}

// acceptFrom takes the peers inside src out of the open ones and reports
// whether none is left. A node that knows no peer cannot tell what a
// source limit leaves out: such an accept decides nothing.
func (w *inputWalk) acceptFrom(src netip.Prefix) bool {
	if len(w.f.peers) == 0 {
		return false
	}
	w.bySource = true
	w.open = slices.DeleteFunc(slices.Clone(w.open), func(p underlayPeer) bool { return src.Contains(p.addr.Unmap()) })
	return len(w.open) == 0
}

// uncovered are the peers that accepts limited to sources left out.
func (w *inputWalk) uncovered() []underlayPeer {
	if !w.bySource {
		return nil
	}
	return w.open
}

// chainVerdict walks the rules of a chain (and the chains its rules jump
// or go to, a few levels deep) and records in v the first rule that
// accepts or drops the port; decided is false when none did. Rules that
// accept the port from some sources only decide once they have accepted
// every peer. A jump that has matches of its own (firewalld's
// per-interface zones, ufw's chains) is taken as passing the port's
// datagrams: an accept in its chain decides, a drop there does not (the
// match may not cover them). A match of the family alone (meta nfproto)
// is not one of those: a jump only for the evaluated family counts as
// unconditional, one only for the other family is not followed.
func (w *inputWalk) chainVerdict(name string, v *portVerdict, depth int) (bool, error) {
	if depth > 6 {
		return false, nil
	}
	rules, err := w.c.GetRules(w.t, &nftables.Chain{Name: name, Table: w.t})
	if err != nil {
		return false, fmt.Errorf("rules of %s %s: %w", w.t.Name, name, err)
	}
	for _, r := range rules {
		if target, matches := ruleJump(r); target != "" {
			if excludesFamily(r.Exprs, w.f.v6) {
				continue
			}
			var sub portVerdict
			decided, err := w.chainVerdict(target, &sub, depth+1)
			if err != nil {
				return false, err
			}
			if decided && (!sub.drops || !matches) {
				v.drops, v.rule = sub.drops, sub.rule
				return true, nil
			}
			continue
		}
		verdict, from := portRule(r, w.f.v6, w.f.port)
		switch {
		case verdict == "accept" && !from.IsValid():
			return true, nil
		case verdict == "accept":
			if w.acceptFrom(from) {
				return true, nil
			}
		case verdict == "drop":
			v.drops, v.rule = true, describeRule(r, w.f.port)
			if depth > 0 {
				v.rule += " in chain " + name
			}
			return true, nil
		}
	}
	return false, nil
}

// ruleJump returns the chain a rule jumps or goes to ("" for none) and
// whether the rule has matches (anything but a counter, a match of the
// packet's family and the verdict).
func ruleJump(r *nftables.Rule) (target string, matches bool) {
	family := false // the last expression loaded the family
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Counter:
		case *expr.Meta:
			family, matches = familyLoad(e), matches || !familyLoad(e)
			continue
		case *expr.Cmp:
			matches = matches || !family
		case *expr.Verdict:
			if e.Kind == expr.VerdictJump || e.Kind == expr.VerdictGoto {
				target = e.Chain
			}
		default:
			matches = true
		}
		family = false
	}
	return target, matches
}

// portRule says what a rule does with a UDP datagram of a family (IPv6
// when v6) to port: "accept" when it accepts everything, or matches the
// port (and UDP, if it names a protocol) and nothing narrower and accepts;
// "drop" when it drops or rejects everything, or the port and nothing
// else; "" when it does not decide for every peer's datagrams, and for
// every datagram when its family match (meta nfproto) names the other
// family. An accept limited to one source prefix (`ip saddr
// 192.168.77.0/24 udp dport 8472 accept`, or with no port: the underlay
// trusted) is "accept" from that prefix (from is invalid for an accept
// from everywhere); one limited to interfaces or marks, or to a set of
// sources, leaves the peers to the rules after it and the policy. A
// conntrack state match that includes new (firewalld's `ct state
// new,untracked`) does not narrow an accept: VXLAN's hashed source ports
// open new flows, and the chains that use it accept established ones
// before. A drop with any other match does not decide (conntrack state
// does not cover VXLAN's hashed source ports).
func portRule(r *nftables.Rule, v6 bool, port uint16) (verdict string, from netip.Prefix) {
	if excludesFamily(r.Exprs, v6) {
		return "", netip.Prefix{}
	}
	var (
		matches   int
		portMatch bool
		other     bool       // a match besides the protocol and the port
		narrow    bool       // one that may leave out some peers' datagrams
		load      = loadNone // what the last load put in a register
		ctMask    uint32
		mask      []byte // the mask applied to a loaded source address
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
			if load == loadFamily {
				load = loadNone
				continue
			}
			matches++
			switch load {
			case loadProto:
				if e.Op != expr.CmpOpEq || len(e.Data) != 1 || e.Data[0] != 17 {
					return "", netip.Prefix{} // not UDP
				}
			case loadDport:
				if e.Op != expr.CmpOpEq || len(e.Data) != 2 || binary.BigEndian.Uint16(e.Data) != port {
					return "", netip.Prefix{} // another port
				}
				portMatch = true
			case loadCtState:
				other = true
				narrow = narrow || e.Op != expr.CmpOpNeq || !allZero(e.Data) || ctMask&ctStateNew == 0
			case loadSaddr:
				other = true
				p, ok := sourcePrefix(e.Data, mask, v6)
				if e.Op != expr.CmpOpEq || !ok || from.IsValid() {
					narrow = true // a negation, a second source match
				}
				from = p
			default:
				other, narrow = true, true
			}
			load = loadNone
		case *expr.Verdict:
			switch e.Kind {
			case expr.VerdictAccept:
				verdict = "accept"
			case expr.VerdictDrop:
				verdict = "drop"
			}
		case *expr.Reject:
			verdict = "drop"
		default: // a set lookup, a range, a match of iptables' xtables...
			other, narrow = true, true
		}
	}
	switch {
	case matches == 0 && !other:
		return verdict, netip.Prefix{} // accepts or drops everything
	case verdict == "accept" && !narrow && (portMatch || from.IsValid()):
		return "accept", from
	case portMatch && verdict == "drop" && !other:
		return "drop", netip.Prefix{}
	}
	return "", netip.Prefix{}
}

// What a rule's load expression put in a register, for portRule.
const (
	loadNone    = iota
	loadOther   // something portRule does not tell apart
	loadFamily  // the packet's family: excludesFamily matched it
	loadProto   // the layer-4 protocol
	loadDport   // the transport destination port
	loadCtState // conntrack's state bits
	loadSaddr   // the network source address
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
