package doctor

import (
	"encoding/binary"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/weft-net/weft/backend/forward"
	"github.com/weft-net/weft/backend/vxlan"
)

// checkFirewall reports iptables-legacy tables, which `nft list ruleset`
// and the kernel's nftables trace do not show.
func checkFirewall(s *state) {
	if v4, v6 := s.legacyTables(); len(v4)+len(v6) > 0 {
		s.r.add("firewall/iptables-legacy", Warn, "check them with `iptables-legacy -S` and `ip6tables-legacy -S` (and migrate them to iptables-nft or nft)",
			"iptables-legacy tables %s are loaded: their rules run beside nftables, and `nft list ruleset` does not show them "+
				"(firewall/forward sees whether they let forwarded traffic through, firewall/input does not)", legacyNames(v4, v6))
	}
}

// legacyTables lists the loaded iptables-legacy and ip6tables-legacy
// tables.
func (s *state) legacyTables() (v4, v6 []string) {
	names, _ := s.procNet("ip_tables_names")
	names6, _ := s.procNet("ip6_tables_names")
	return strings.Fields(names), strings.Fields(names6)
}

func legacyNames(v4, v6 []string) string {
	out := slices.Clone(v4)
	for _, n := range v6 {
		out = append(out, "ip6 "+n)
	}
	return strings.Join(out, ", ")
}

// suspects lists, where the kernel cannot say why, this node's suspects
// for traffic of families (ip and ip6 tables of other families are left
// out, as are weft's own tables): the base chains on hook with policy drop
// that nothing accepts first, or whose rules, or those of the chains they
// jump to, drop or reject all they see (see walk); the rules on the
// host's hooks that compare a port with one of ports; and loaded
// iptables-legacy tables. With each, the rules open makes to let the
// traffic through (e: the table and chain, and the rule to insert before,
// or 0 for the chain's start; legacy for iptables-legacy's own table). err
// says that nftables could not be read.
func (s *state) suspects(hook *nftables.ChainHook, ports []uint16, families []nftables.TableFamily, open func(e traceEvent, legacy bool) []string) (found, fixes []string, err error) {
	inUse := func(f nftables.TableFamily) bool {
		return f == nftables.TableFamilyINet || slices.Contains(families, f)
	}
	var opened []traceEvent // the chains whose accepts go first
	add := func(fs []string) {
		for _, f := range fs {
			if f != "" && !slices.Contains(fixes, f) {
				fixes = append(fixes, f)
			}
		}
	}
	err = s.baseChains(func(c *nftables.Conn, ch *nftables.Chain) error {
		if !ipFamily(ch.Table.Family) || !inUse(ch.Table.Family) || *ch.Hooknum != *hook {
			return nil
		}
		end, why, err := walk(c, ch.Table, ch.Name, ch.Name, map[string]bool{})
		if end == passes && ch.Policy != nil && *ch.Policy == nftables.ChainPolicyDrop {
			why = "policy drop"
		}
		if why != "" {
			e := traceEvent{family: ch.Table.Family, table: ch.Table.Name, chain: ch.Name} // the accept goes first in the chain
			found = append(found, fmt.Sprintf("table %s %s chain %s %s", familyName(e.family), e.table, e.chain, why))
			add(open(e, false))
			opened = append(opened, e)
		}
		return err
	})
	for _, port := range slices.Compact(slices.Clone(ports)) {
		if err != nil {
			break
		}
		var rules []portRule
		rules, err = s.portRules(int(port))
		for _, r := range rules {
			if ipFamily(r.family) && !inUse(r.family) {
				continue
			}
			found = append(found, fmt.Sprintf("table %s %s chain %s rule handle %d on UDP %d", familyName(r.family), r.table, r.chain, r.handle, port))
			chain := traceEvent{family: r.family, table: r.table, chain: r.chain}
			if r.hook == *hook && ipFamily(r.family) && !slices.Contains(opened, chain) {
				add(open(r.traceEvent, false)) // the accept goes before the rule
			}
		}
	}
	if err != nil {
		found = append(found, fmt.Sprintf("(nftables unreadable: %v)", err))
	}
	v4, v6 := s.legacyTables()
	if !inUse(nftables.TableFamilyIPv4) {
		v4 = nil
	}
	if !inUse(nftables.TableFamilyIPv6) {
		v6 = nil
	}
	if len(v4)+len(v6) > 0 {
		found = append(found, "iptables-legacy tables "+legacyNames(v4, v6)+" (iptables-legacy -S, ip6tables-legacy -S)")
	}
	for _, f := range []struct {
		tables []string
		family nftables.TableFamily
	}{{v4, nftables.TableFamilyIPv4}, {v6, nftables.TableFamilyIPv6}} {
		if slices.Contains(f.tables, "filter") {
			add(open(traceEvent{family: f.family, table: "filter", chain: strings.ToUpper(hookName(*hook))}, true))
		}
	}
	return found, fixes, err
}

// What a chain does with a packet that no rule with a condition took.
const (
	passes   = iota // on to the next rule of the chain that jumped here, or the policy
	accepted        // an accept, or weft's own WEFT-FWD, which accepts the cluster network
	dropped         // a drop or reject
)

// walk follows chain's rules that have no condition (a counter, a log or
// an iptables comment aside): a verdict ends it, a jump or goto follows
// that chain;
// why names the rule that drops. Rules with a condition are not evaluated:
// walk finds the drops and rejects that take all a chain sees, as
// firewalld's, RHEL's and NixOS's last rules do.
func walk(c *nftables.Conn, t *nftables.Table, base, chain string, seen map[string]bool) (end int, why string, err error) {
	if seen[chain] {
		return passes, "", nil
	}
	seen[chain] = true
	if chain == forward.Chain {
		return accepted, "", nil
	}
	of := ""
	if chain != base {
		of = " of chain " + chain
	}
	rules, err := c.GetRules(t, &nftables.Chain{Name: chain, Table: t})
	for _, r := range rules {
		v, ok := verdictOnly(r)
		switch {
		case !ok:
		case v == nil:
			return dropped, fmt.Sprintf("rule handle %d%s rejects", r.Handle, of), err
		case v.Kind == expr.VerdictDrop:
			return dropped, fmt.Sprintf("rule handle %d%s drops", r.Handle, of), err
		case v.Kind == expr.VerdictAccept:
			return accepted, "", err
		case v.Kind == expr.VerdictReturn:
			return passes, "", err
		case v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto:
			end, why, err := walk(c, t, base, v.Chain, seen)
			if end != passes || v.Kind == expr.VerdictGoto || err != nil {
				return end, why, err
			}
		}
	}
	return passes, "", err
}

// verdictOnly reports whether r has no condition, with its verdict (nil
// for a reject).
func verdictOnly(r *nftables.Rule) (*expr.Verdict, bool) {
	var v *expr.Verdict
	reject := false
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Counter, *expr.Log:
		case *expr.Match:
			if e.Name != "comment" {
				return nil, false
			}
		case *expr.Verdict:
			v = e
		case *expr.Reject:
			reject = true
		case *expr.Target:
			if e.Name != "REJECT" {
				return nil, false
			}
			reject = true
		default:
			return nil, false
		}
	}
	return v, v != nil || reject
}

// baseChains calls f, in the node's namespace, for each nftables base
// chain that is not in one of weft's own tables.
func (s *state) baseChains(f func(c *nftables.Conn, ch *nftables.Chain) error) error {
	return s.Do.Run(func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		chains, err := c.ListChains()
		if err != nil {
			return err
		}
		for _, ch := range chains {
			if ch.Hooknum != nil && !weftTable(ch.Table.Name) {
				if err := f(c, ch); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// weftTable reports whether a table is weft's own (its masquerade, peer
// filter, NetworkPolicy, CNI masquerade and doctor's trace tables are all
// named weft-…): what those drop is weft's to drop, not a firewall in the
// way (firewall/vxlan-peers reports on the peer filter).
func weftTable(name string) bool { return strings.HasPrefix(name, "weft-") }

// weftFilter reports whether t is the vxlan backend's peer filter.
func weftFilter(t *nftables.Table) bool {
	return t.Name == vxlan.FilterTable && t.Family == nftables.TableFamilyINet
}

// portRule is a rule that compares a transport port: where it is.
type portRule struct {
	traceEvent
	hook nftables.ChainHook
}

func (r portRule) String() string {
	return fmt.Sprintf("table %s %s chain %s rule %d", familyName(r.family), r.table, r.chain, r.handle)
}

// portRules finds the rules of the base chains on the input, output,
// prerouting and postrouting hooks that compare a UDP or TCP port with
// port (`udp dport 8472`), weft's peer filter left out.
func (s *state) portRules(port int) ([]portRule, error) {
	want := binary.BigEndian.AppendUint16(nil, uint16(port))
	var out []portRule
	err := s.baseChains(func(c *nftables.Conn, ch *nftables.Chain) error {
		if h := *ch.Hooknum; h != *nftables.ChainHookInput && h != *nftables.ChainHookOutput && h != *nftables.ChainHookPrerouting && h != *nftables.ChainHookPostrouting {
			return nil
		}
		rules, err := c.GetRules(ch.Table, ch)
		for _, r := range rules {
			loaded := map[uint32]bool{} // registers holding a port
			if slices.ContainsFunc(r.Exprs, func(e expr.Any) bool {
				switch e := e.(type) {
				case *expr.Payload:
					loaded[e.DestRegister] = e.Base == expr.PayloadBaseTransportHeader && e.Len == 2 && (e.Offset == 0 || e.Offset == 2)
				case *expr.Cmp:
					return e.Op == expr.CmpOpEq && loaded[e.Register] && string(e.Data) == string(want)
				}
				return false
			}) {
				out = append(out, portRule{traceEvent{family: ch.Table.Family, table: ch.Table.Name, chain: ch.Name, handle: r.Handle}, *ch.Hooknum})
			}
		}
		return err
	})
	return out, err
}

func familyName(f nftables.TableFamily) string {
	return map[nftables.TableFamily]string{nftables.TableFamilyIPv4: "ip", nftables.TableFamilyIPv6: "ip6",
		nftables.TableFamilyINet: "inet", nftables.TableFamilyBridge: "bridge", nftables.TableFamilyNetdev: "netdev"}[f]
}

// ipFamily reports whether f's hooks are the IP stack's (not netdev's,
// bridge's or arp's, whose hooks share their numbers).
func ipFamily(f nftables.TableFamily) bool {
	return f == nftables.TableFamilyIPv4 || f == nftables.TableFamilyIPv6 || f == nftables.TableFamilyINet
}

func hookName(h nftables.ChainHook) string {
	return map[nftables.ChainHook]string{*nftables.ChainHookInput: "input", *nftables.ChainHookForward: "forward"}[h]
}

// ruleTexts names the rules and policies in trace events, with each
// rule's text from `nft -a list chain` when nft is installed (read once a
// chain).
type ruleTexts struct {
	s      *state
	chains map[string]map[uint64]string
}

var handleRE = regexp.MustCompile(`^\s*(.*\S)\s+# handle (\d+)$`)

func (r *ruleTexts) describe(e traceEvent) string {
	where := fmt.Sprintf("table %s %s chain %s", familyName(e.family), e.table, e.chain)
	if e.handle == 0 {
		return where + " by its policy " + map[bool]string{true: "accept", false: "drop"}[e.verdict == 1]
	}
	if r.chains == nil {
		r.chains = map[string]map[uint64]string{}
	}
	texts, ok := r.chains[where]
	if !ok {
		texts = map[uint64]string{}
		var out []byte
		_ = r.s.Do.Run(func() (err error) {
			out, err = exec.Command("nft", "-a", "list", "chain", familyName(e.family), e.table, e.chain).Output()
			return err
		})
		for _, l := range strings.Split(string(out), "\n") {
			if m := handleRE.FindStringSubmatch(l); m != nil {
				var h uint64
				fmt.Sscan(m[2], &h)
				texts[h] = m[1]
			}
		}
		r.chains[where] = texts
	}
	if t := texts[e.handle]; t != "" {
		return fmt.Sprintf("%s by rule handle %d (%s)", where, e.handle, t)
	}
	return fmt.Sprintf("%s by rule handle %d", where, e.handle)
}

// decision is the first drop (or reject) among one packet's trace events,
// or else the chains and rules that accepted it; doctor's own chain and
// weft's peer filter are left out of those.
func (r *ruleTexts) decision(evs []traceEvent) (*traceEvent, []string) {
	var accepts []string
	for _, e := range evs {
		switch {
		case e.verdict == 0: // NF_DROP
			return &e, nil
		case e.verdict == 1 && !strings.HasPrefix(e.table, traceTable) && !weftFilter(&nftables.Table{Name: e.table, Family: e.family}): // NF_ACCEPT
			if d := r.describe(e); !slices.Contains(accepts, d) {
				accepts = append(accepts, d)
			}
		}
	}
	if len(accepts) == 0 {
		accepts = []string{"no chain but doctor's own trace chain met it"}
	}
	return nil, accepts
}
