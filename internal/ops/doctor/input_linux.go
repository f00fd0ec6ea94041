package doctor

import (
	"bytes"
	"cmp"
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
	// only are the peers a drop holds when a rule limited to their sources
	// leads to it (firewalld's source zones); nil for a drop of all.
	only []underlayPeer
	both bool // the same verdict holds for IPv4 and IPv6
	// doubt is why the walk cannot tell that the chain lets the port
	// through when it found no drop (see checkInput for each kind).
	doubt string
}

// doubtf records why the walk cannot tell, unless a doubt is recorded
// already (the first one is reported).
func (v *portVerdict) doubtf(format string, a ...any) {
	if v.doubt == "" {
		v.doubt = fmt.Sprintf(format, a...)
	}
}

// checkInput looks for nftables chains on the input hook (native ones and
// iptables-nft's INPUT and ip6tables-nft's) that drop the overlay's UDP
// port, for each underlay family of the node (see underlayFamilies): in
// ip tables for IPv4, ip6 tables for IPv6, inet and bridge tables for
// both, where a rule's family match (meta nfproto) limits it to one. A
// chain drops the port by a rule that drops or rejects datagrams to it, or
// by a policy drop that no rule before it overrides with an accept of the
// port from every peer: from everywhere, or from sources that together
// hold every peer's public address of the family (see ruleMatch.decides and
// chainVerdict). Such a chain drops the VXLAN or WireGuard datagrams of
// the peers, whatever weft programs: a failure. With uvxlan's fast path
// attached it drops only the datagrams of peers on the userspace path
// (the fast path takes the others before netfilter): a warning. A chain
// that drops nothing for certain but whose walk met what doctor cannot
// evaluate (a verdict map other than one keyed on ct state, a chain too
// deep, and a drop or the policy after them; an accept after a return or
// goto by such a match or in a chain reached through one; a drop after
// such a return; on a node that knows no peer, accepts and drops limited
// to sources) is a warning, never an ok. iptables-legacy's INPUT is not read.
func checkInput(s *state) {
	if s.Config == nil {
		return
	}
	port, what, ok := tunnelPort(s.Config)
	if !ok {
		return
	}
	families, unknown := s.underlayFamilies(port)
	found, doubts, bySource, err := s.inputVerdicts(families)
	if err != nil {
		s.r.add("firewall/input", Warn, "", "read nftables chains: %v", err)
		return
	}
	note := ""
	if unknown != "" {
		note = " (" + unknown + ")"
	}
	sc := s.inputDropScope(what)
	for _, v := range found {
		s.reportInput(v, len(families) > 1, what, sc, note)
	}
	for _, d := range doubts {
		s.r.add("firewall/input", Warn, "check what that rule does with the peers' datagrams, or insert an accept of the port before it",
			"%s: cannot tell whether it lets %s through: %s%s", d.chain, portsLine(families, what), d.doubt, note)
	}
	if len(found) == 0 && len(doubts) == 0 {
		if bySource {
			note += "; rules accept it from sources that hold every peer's public address (a peer whose --public-ip is not its underlay address sends from the underlay address, which the lease does not tell)"
		}
		s.r.ok("firewall/input", "no input chain drops %s%s", portsLine(families, what), note)
	}
}

// portsLine names the port of each family, and the families on a
// dual-stack or IPv6 node: "UDP 8472 (VXLAN) over IPv4 and IPv6", or
// "UDP 51820 over IPv4 or UDP 51821 over IPv6 (WireGuard)" when their
// ports differ.
func portsLine(families []underlayFamily, what string) string {
	if len(families) == 2 && families[0].port != families[1].port {
		return fmt.Sprintf("UDP %d over %s or UDP %d over %s (%s)", families[0].port, families[0], families[1].port, families[1], what)
	}
	fams := make([]string, len(families))
	for i, f := range families {
		fams[i] = f.String()
	}
	on := ""
	if len(families) > 1 || families[0].v6 {
		on = " over " + strings.Join(fams, " and ")
	}
	return fmt.Sprintf("UDP %d (%s)%s", families[0].port, what, on)
}

// inputVerdicts walks each filter chain on the input hook for each family
// whose datagrams it sees and returns the verdicts that drop the port,
// and those of chains that drop nothing for certain but whose walk had a
// doubt (one a chain); bySource is true when a chain accepts it only
// through accepts limited to sources.
func (s *state) inputVerdicts(families []underlayFamily) (found, doubts []portVerdict, bySource bool, err error) {
	err = s.hookChains(nftables.ChainHookInput, func(c *nftables.Conn, ch *nftables.Chain) error {
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
			decided, err := w.chainVerdict(ch.Name, &v, walkScope{}, 0)
			if err != nil {
				return err
			}
			switch {
			case decided || !v.policy || w.skipped != "":
			case w.unsure != "":
				v.doubtf("%s, and the chain's policy drops the others", w.unsure)
			default:
				v.drops = true
			}
			if v.drops {
				if v.only == nil {
					v.uncovered = w.uncovered()
				}
				found = mergeFamilies(found, v)
			} else if v.doubt != "" {
				if !slices.ContainsFunc(doubts, func(d portVerdict) bool { return d.chain == v.chain }) {
					doubts = append(doubts, v)
				}
			} else if decided && len(w.open) == 0 {
				bySource = bySource || w.bySource
			}
		}
		return nil
	})
	return found, doubts, bySource, err
}

// reportInput reports a chain that drops the port, with the fix: an accept
// of the port, or of the peers that accepts by source left out. The
// family is named on a dual-stack or IPv6 node (dual: the node has both);
// note is added to the evidence.
func (s *state) reportInput(v portVerdict, dual bool, what string, sc dropScope, note string) {
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
	const judged = "; judged by the peers' public addresses"
	left := ""
	switch {
	case len(v.only) > 0:
		fix, sc = acceptSources(v, v.only), sc.only(v.only, what)
		left = " (a rule limited to sources that hold them leads there" + judged + ")"
	case len(v.uncovered) > 0:
		fix, sc = acceptSources(v, v.uncovered), sc.only(v.uncovered, what)
		left = fmt.Sprintf(" (rules before it accept UDP %d only from sources that leave them out%s)", v.family.port, judged)
	}
	if v.rule != "" {
		s.r.add("firewall/input", sc.status, "delete that rule, or "+fix,
			"%s drops UDP %d%s (%s, %s) by rule %q%s%s%s", v.chain, v.family.port, over, what, sc.whom, v.rule, left, sc.bypass, note)
		return
	}
	left = ""
	if len(v.uncovered) > 0 {
		left = fmt.Sprintf(" (rules accept it only from sources that leave out %s%s)", peerList(v.uncovered), judged)
	}
	s.r.add("firewall/input", sc.status, fix,
		"%s has policy drop and no rule accepting UDP %d%s from every peer%s: %s that no rule accepts are dropped there, whatever other tables accept%s%s",
		v.chain, v.family.port, over, left, sc.dropped, sc.bypass, note)
}

// mergeFamilies adds v to found, or marks the verdict found for the other
// family in the same chain as holding for both when it is the same.
func mergeFamilies(found []portVerdict, v portVerdict) []portVerdict {
	for i, o := range found {
		if o.chain == v.chain && o.family.v6 != v.family.v6 && o.family.port == v.family.port && o.rule == v.rule &&
			len(o.uncovered) == 0 && len(v.uncovered) == 0 && len(o.only) == 0 && len(v.only) == 0 {
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

// only is the scope narrowed to the peers that accepts by source left
// out: "every VXLAN datagram from peer 192.168.77.9 (10.244.9.0/24)".
func (sc dropScope) only(peers []underlayPeer, what string) dropScope {
	if sc.status == Warn {
		sc.whom = "the datagrams of " + peerList(peers) + " when on the userspace path"
	} else {
		sc.whom = "every " + what + " datagram from " + peerList(peers)
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
	// skipped is what the walk passed without evaluating it (a verdict
	// map, a chain too deep): a drop after it, or the policy, is a doubt.
	skipped string
	// unsure is why a drop after an accept limited to sources is a doubt
	// on a node that knows no peer; "" when there was none.
	unsure string
}

// elementVerdict reads the verdict of a verdict map's element: the
// nested netlink attributes of the kernel's NFTA_DATA_VERDICT (a code
// and, for a jump or goto, a chain), which the nftables module leaves in
// the element's Val.
func elementVerdict(b []byte) (*expr.Verdict, bool) {
	const (
		verdictCode  = 1 // NFTA_VERDICT_CODE
		verdictChain = 2 // NFTA_VERDICT_CHAIN
	)
	var (
		v    expr.Verdict
		code bool
	)
	for len(b) >= 4 {
		n, typ := int(binary.NativeEndian.Uint16(b)), binary.NativeEndian.Uint16(b[2:])&0x3fff
		if n < 4 || n > len(b) {
			return nil, false
		}
		data := b[4:n]
		switch {
		case typ == verdictCode && len(data) == 4:
			v.Kind, code = expr.VerdictKind(int32(binary.BigEndian.Uint32(data))), true
		case typ == verdictChain:
			v.Chain = strings.TrimRight(string(data), "\x00")
		}
		b = b[min(len(b), (n+3)&^3):]
	}
	return &v, code
}

// setElements reads the set (or map) of the walk's table named name and
// its elements.
func (w *inputWalk) setElements(name string) (*nftables.Set, []nftables.SetElement, error) {
	set, err := w.c.GetSetByName(w.t, name)
	if err != nil {
		return nil, nil, err
	}
	elems, err := w.c.GetSetElements(set)
	return set, elems, err
}

// inPortSet resolves a lookup of the destination port in a set (NixOS's
// `udp dport { 8472, 22 } accept`): the rule matches the port when the
// set holds it, and nothing when it does not. When the set's elements
// cannot be read the lookup narrows the rule, and the error is in the
// doubt.
func (w *inputWalk) inPortSet(m ruleMatch, r *nftables.Rule, name string, v *portVerdict) ruleMatch {
	set, elems, err := w.setElements(m.portSet)
	m.portSet = ""
	if err != nil {
		v.doubtf("rule (handle %d) in chain %s looks the port up in a set whose elements doctor could not read: %v", r.Handle, name, err)
		m.other, m.narrow, m.extra = true, true, true
		return m
	}
	want := binary.BigEndian.AppendUint16(nil, w.f.port)
	in := false
	if set.Interval {
		// Interval sets hold each range's start and, flagged, its end
		// (one past it): the port is in when the nearest element at or
		// below it is a start.
		slices.SortFunc(elems, func(a, b nftables.SetElement) int { return bytes.Compare(a.Key, b.Key) })
		for _, e := range elems {
			if len(e.Key) != 2 || bytes.Compare(e.Key, want) > 0 {
				break
			}
			in = !e.IntervalEnd
		}
	} else {
		in = slices.ContainsFunc(elems, func(e nftables.SetElement) bool { return bytes.Equal(e.Key, want) })
	}
	if !in {
		m.excluded = true
		return m
	}
	m.portMatch = true
	return m
}

// ctNew resolves a verdict map keyed on ct state (NixOS's `ct state vmap {
// invalid : drop, established : accept, related : accept, new : jump
// input-allow, untracked : jump input-allow }`) for the overlay's first
// datagram of a flow (VXLAN's hashed source ports open new ones): the
// rule becomes the new entry's verdict, jump or goto, or matches nothing
// when the map has no new entry (established, related and invalid entries
// do not decide for it). When the map's elements cannot be read the rule
// stays an unevaluated verdict map, and the error is in the doubt.
func (w *inputWalk) ctNew(m ruleMatch, r *nftables.Rule, name string, v *portVerdict) ruleMatch {
	_, elems, err := w.setElements(m.ctMap)
	if err != nil {
		v.doubtf("rule (handle %d) in chain %s decides by a ct state verdict map whose elements doctor could not read: %v", r.Handle, name, err)
		m.ctMap = ""
		return m
	}
	m.vmap, m.ctMap = false, ""
	for _, e := range elems {
		if len(e.Key) != 4 || binary.NativeEndian.Uint32(e.Key)&ctStateNew == 0 {
			continue
		}
		verdict, ok := elementVerdict(e.Val)
		if !ok {
			v.doubtf("rule (handle %d) in chain %s decides by a ct state verdict map whose new entry doctor could not read", r.Handle, name)
			m.vmap = true
			return m
		}
		m.statement(verdict)
		return m
	}
	m.excluded = true
	return m
}

// walkScope is which of the family's datagrams a chain is walked for: all
// of them (the base chain and chains jumped to unconditionally), those
// from one source prefix (a jump whose only match is that prefix:
// firewalld's source zones), those outside one (ip saddr != P jump:
// except), or some that a match of another kind selects (narrowed:
// firewalld's interface zones; guarded too when doctor does not evaluate
// the match, a mark: an accept there is a doubt), within the source
// prefix when the match has one too. Rules that send some datagrams
// elsewhere (a return, a goto) narrow the rest of the chain: to the
// sources a return leaves out (ip saddr != P return), past the sources a
// return or goto takes (except), or, when doctor cannot tell which
// datagrams they take, to some (blind: an accept after it may not be
// reached by the peers' datagrams; after a return, maybe: a drop may not
// hold for them).
type walkScope struct {
	from     netip.Prefix // the source prefix; invalid for all
	narrowed bool
	except   []netip.Prefix
	blind    bool
	maybe    bool
	guarded  bool // reached by a jump or goto through a match doctor does not evaluate (a mark)
}

// within is the scope of a chain jumped to from this one by a rule whose
// match is m; ok is false when no datagram of the scope reaches it (a
// source prefix disjoint from the scope's).
func (sc walkScope) within(m ruleMatch) (walkScope, bool) {
	sub := sc
	if m.notFrom.IsValid() { // ip saddr != P jump: the sources outside P
		sub.except = append(slices.Clip(sc.except), m.notFrom)
	}
	if _, not, only := m.sourceOnly(); only && not {
		return sub, true
	}
	sub.narrowed = sc.narrowed || m.narrow
	sub.guarded = sc.guarded || m.opaque
	if m.from.IsValid() {
		p, ok := intersect(sc.from, m.from)
		if !ok {
			return sc, false
		}
		sub.from = p
	}
	return sub, true
}

// leaving is the scope of the rest of a chain after a rule with match m
// that returns or goes elsewhere (and, for a goto, whose chain did not
// decide); ok is false when no datagram of the scope is left.
func (sc walkScope) leaving(m ruleMatch, ret bool) (walkScope, bool) {
	src, not, only := m.sourceOnly()
	switch {
	case m.unconditional():
		return sc, false
	case only && not: // ip saddr != P return: P's datagrams stay
		p, ok := intersect(sc.from, src)
		sc.from = p
		return sc, ok
	case only:
		sc.except = append(slices.Clip(sc.except), src)
	default:
		sc.blind, sc.maybe = true, sc.maybe || ret
	}
	return sc, true
}

// holds is whether the scope holds peer p's datagrams (a narrowed scope
// is taken to, by its source prefix).
func (sc walkScope) holds(p underlayPeer) bool {
	a := p.addr.Unmap()
	if sc.from.IsValid() && !sc.from.Contains(a) {
		return false
	}
	return !slices.ContainsFunc(sc.except, func(e netip.Prefix) bool { return e.Contains(a) })
}

// intersect is the prefix both a and b hold (invalid a holds everything);
// ok is false when they are disjoint.
func intersect(a, b netip.Prefix) (netip.Prefix, bool) {
	switch {
	case !a.IsValid() || a.Bits() <= b.Bits() && a.Contains(b.Addr()):
		return b, true
	case b.Bits() <= a.Bits() && b.Contains(a.Addr()):
		return a, true
	}
	return netip.Prefix{}, false
}

// acceptIn takes the open peers of the scope inside src (invalid: from
// everywhere) out of the open ones and reports whether none is left. A
// node that knows no peer cannot tell what a source limit leaves out: an
// accept from a source prefix decides nothing, and a drop after it (the
// policy's too) is a doubt (w.unsure); one from everywhere but the
// sources that a return or goto took before accepts (those sources'
// datagrams were walked where they went).
func (w *inputWalk) acceptIn(sc walkScope, src netip.Prefix) bool {
	if len(w.f.peers) == 0 {
		if !sc.from.IsValid() && !src.IsValid() {
			return true // every source but excluded ones, walked where they went
		}
		w.unsure = cmp.Or(w.unsure, fmt.Sprintf("a rule accepts it from %s only, and this node knows no peer to tell whether they send from there", cmp.Or(src, sc.from)))
		return false
	}
	w.bySource = true
	w.open = slices.DeleteFunc(slices.Clone(w.open), func(p underlayPeer) bool {
		return sc.holds(p) && (!src.IsValid() || src.Contains(p.addr.Unmap()))
	})
	return len(w.open) == 0
}

// uncovered are the peers that accepts limited to sources left out.
func (w *inputWalk) uncovered() []underlayPeer {
	if !w.bySource {
		return nil
	}
	return w.open
}

// chainVerdict walks the rules of a chain for the datagrams of a scope
// (and the chains its rules jump or go to, a few levels deep) and records
// in v the rule that drops the port; decided is true when the walk
// decided: an accept of every peer's datagrams (from everywhere, or by
// accepts limited to sources that together hold every peer), or a drop.
// A return ends the chain for the datagrams it matches; a goto too, after
// the chain it goes to (its datagrams go back to the caller's caller).
// In a chain reached by a jump with a match of its own, or after a return
// or goto with one:
//   - an accept from everywhere accepts the scope's datagrams: from its
//     source prefix (less its except ones), or, in a narrowed scope, all of
//     them (the match is taken to be the underlay's: firewalld's
//     per-interface zones, ufw's chains); in a blind scope an accept is
//     recorded as a doubt (v.doubt): the peers' datagrams may have left;
//   - an accept from a source prefix counts for the part of it inside the
//     scope's, and not at all in a narrowed scope (the match may leave out
//     the peers it holds);
//   - a drop drops the peers of the scope that no rule accepted yet
//     (recorded in v.only when the scope is limited by source), ends the
//     walk of the chain without deciding in a narrowed scope (the match
//     may not cover the peers' datagrams), and, after a return doctor
//     cannot evaluate, is recorded as a doubt (v.doubt) without deciding.
//
// A match of the family alone (meta nfproto) or of UDP and the port does
// not narrow a jump; one only for the other family, another protocol or
// another port is not followed. A verdict map on the path is recorded as
// a doubt.
func (w *inputWalk) chainVerdict(name string, v *portVerdict, sc walkScope, depth int) (bool, error) {
	if depth > maxDepth {
		v.doubtf("chain %s is more than %d jumps deep, past what doctor walks", name, maxDepth)
		w.skipped = cmp.Or(w.skipped, "a chain too deep")
		return false, nil
	}
	rules, err := w.c.GetRules(w.t, &nftables.Chain{Name: name, Table: w.t})
	if err != nil {
		return false, fmt.Errorf("rules of %s %s: %w", w.t.Name, name, err)
	}
	for _, r := range rules {
		m := matchRule(r, w.f.v6, w.f.port)
		if m.ctMap != "" {
			m = w.ctNew(m, r, name, v)
		}
		if m.portSet != "" {
			m = w.inPortSet(m, r, name, v)
		}
		var ok bool
		switch {
		case m.excluded:
			continue
		case m.vmap:
			// The map may accept or drop the peers' datagrams: what
			// follows (a drop, the policy) is a doubt, not a drop.
			v.doubtf("rule (handle %d) in chain %s decides by a verdict map, which doctor does not evaluate", r.Handle, name)
			w.skipped = cmp.Or(w.skipped, "a verdict map")
			continue
		case m.verdict == "return":
			if sc, ok = sc.leaving(m, true); !ok {
				return false, nil
			}
			continue
		case m.jump != "":
			sub, ok := sc.within(m)
			if !ok {
				continue
			}
			decided, err := w.chainVerdict(m.jump, v, sub, depth+1)
			if err != nil || decided {
				return decided, err
			}
			if m.isGoto {
				if sc, ok = sc.leaving(m, false); !ok {
					return false, nil
				}
			}
			continue
		}
		if decided, end := w.ruleVerdict(r, m, name, v, sc, depth); end {
			return decided, nil
		}
	}
	return false, nil
}

// maxDepth is how many jumps deep chainVerdict walks.
const maxDepth = 6

// ruleVerdict applies a rule's accept or drop to the walk of a chain (see
// chainVerdict); end is true when the walk of the chain ends there.
func (w *inputWalk) ruleVerdict(r *nftables.Rule, m ruleMatch, name string, v *portVerdict, sc walkScope, depth int) (decided, end bool) {
	verdict, from := m.decides()
	if verdict == "accept" && sc.guarded {
		v.doubtf("rule (handle %d) in chain %s accepts it in a chain reached through a match doctor cannot evaluate (a mark, a set), which the peers' datagrams may not pass", r.Handle, name)
	}
	if verdict == "accept" && sc.blind {
		v.doubtf("rule (handle %d) in chain %s accepts it after a return or goto by a match doctor cannot evaluate, which may take the peers' datagrams", r.Handle, name)
	}
	switch {
	case verdict == "accept" && !from.IsValid():
		if sc.from.IsValid() || len(sc.except) > 0 {
			return w.acceptIn(sc, netip.Prefix{}), true // the walk of this chain ends for the scope's datagrams
		}
		return true, true
	case verdict == "accept" && !sc.narrowed:
		if p, ok := intersect(sc.from, from); ok && w.acceptIn(sc, p) {
			return true, true
		}
	case verdict == "drop" && sc.narrowed:
		return false, true
	case verdict == "drop" && w.skipped != "":
		v.doubtf("rule %q in chain %s drops it after %s doctor does not evaluate", describeRule(r, w.f.port), name, w.skipped)
		return false, true
	case verdict == "drop" && sc.maybe:
		v.doubtf("rule %q in chain %s drops it after a return whose match doctor cannot evaluate", describeRule(r, w.f.port), name)
		return false, true
	case verdict == "drop" && (sc.from.IsValid() || len(sc.except) > 0):
		if len(w.f.peers) == 0 {
			v.doubtf("rule %q in chain %s drops it from some sources, and this node knows no peer to tell whether they send from them", describeRule(r, w.f.port), name)
			return false, true
		}
		// Its datagrams that no rule accepted yet are dropped.
		v.only = slices.DeleteFunc(slices.Clone(w.open), func(p underlayPeer) bool { return !sc.holds(p) })
		if len(v.only) == 0 {
			v.only = nil
			return false, true
		}
		v.drops, v.rule = true, describeRule(r, w.f.port)+" in chain "+name
		return true, true
	case verdict == "drop" && w.unsure != "":
		v.doubtf("%s, and rule %q in chain %s drops the others", w.unsure, describeRule(r, w.f.port), name)
		return false, true
	case verdict == "drop":
		v.drops, v.rule = true, describeRule(r, w.f.port)
		if depth > 0 {
			v.rule += " in chain " + name
		}
		return true, true
	}
	return false, false
}
