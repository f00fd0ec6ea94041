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

	"github.com/weft-net/weft/backend/masq"
	"github.com/weft-net/weft/backend/vxlan"
)

// checkFirewall reports iptables-legacy tables, which `nft list ruleset`
// and the kernel's nftables trace do not show.
func checkFirewall(s *state) {
	if legacy := s.legacyTables(); legacy != "" {
		s.r.add("firewall/iptables-legacy", Warn, "check them with `iptables-legacy -S` and `ip6tables-legacy -S` (and migrate them to iptables-nft or nft)",
			"iptables-legacy tables %s are loaded: their rules run beside nftables, and `nft list ruleset` does not show them "+
				"(firewall/forward sees whether they let forwarded traffic through, firewall/input does not)", legacy)
	}
}

// legacyTables names the loaded iptables-legacy and ip6tables-legacy
// tables, "" when none.
func (s *state) legacyTables() string {
	var out []string
	for _, f := range []struct{ proc, prefix string }{{"ip_tables_names", ""}, {"ip6_tables_names", "ip6 "}} {
		names, _ := s.procNet(f.proc)
		for _, n := range strings.Fields(names) {
			out = append(out, f.prefix+n)
		}
	}
	return strings.Join(out, ", ")
}

// suspects lists, where the kernel cannot say why, this node's suspects:
// the ip, ip6 and inet chains on hook with policy drop, the rules on the
// host's hooks that compare a port with one of ports, and loaded
// iptables-legacy tables; and for each the rule fix makes to open it, when
// it makes one (legacy is true for iptables-legacy's own table).
func (s *state) suspects(hook *nftables.ChainHook, ports []uint16, fix func(e traceEvent, legacy bool) string) (found, fixes []string) {
	add := func(f string) {
		if f != "" && !slices.Contains(fixes, f) {
			fixes = append(fixes, f)
		}
	}
	err := s.baseChains(func(_ *nftables.Conn, ch *nftables.Chain) error {
		if ipFamily(ch.Table.Family) && *ch.Hooknum == *hook && ch.Policy != nil && *ch.Policy == nftables.ChainPolicyDrop {
			found = append(found, fmt.Sprintf("table %s %s chain %s policy drop", familyName(ch.Table.Family), ch.Table.Name, ch.Name))
			add(fix(traceEvent{family: ch.Table.Family, table: ch.Table.Name, chain: ch.Name}, false))
		}
		return nil
	})
	for _, port := range slices.Compact(slices.Clone(ports)) {
		if err != nil {
			break
		}
		var rules []portRule
		rules, err = s.portRules(int(port))
		for _, r := range rules {
			found = append(found, fmt.Sprintf("table %s %s chain %s rule handle %d on UDP %d", familyName(r.family), r.table, r.chain, r.handle, port))
			if r.hook == *hook && ipFamily(r.family) {
				add(fix(r.traceEvent, false))
			}
		}
	}
	if err != nil {
		found = append(found, fmt.Sprintf("(nftables unreadable: %v)", err))
	}
	if legacy := s.legacyTables(); legacy != "" {
		found = append(found, "iptables-legacy tables "+legacy+" (iptables-legacy -S, ip6tables-legacy -S)")
		add(fix(traceEvent{family: nftables.TableFamilyIPv4, table: "filter", chain: strings.ToUpper(hookName(*hook))}, true))
	}
	return found, fixes
}

// noSuspects is the evidence, after why, that this node has no suspect.
func noSuspects(hook *nftables.ChainHook, ports []uint16) string {
	rules := ""
	if len(ports) > 0 {
		rules = fmt.Sprintf(", no rule on UDP %s", strings.Trim(strings.Join(strings.Fields(fmt.Sprint(slices.Compact(slices.Clone(ports)))), " or "), "[]"))
	}
	return fmt.Sprintf("; suspects: none on this node (no %s chain with policy drop%s, no iptables-legacy table)", hookName(*hook), rules)
}

// baseChains calls f, in the node's namespace, for each nftables base
// chain that is not in weft's masquerade tables or the kernel VXLAN
// backend's peer filter (firewall/vxlan-peers reports that one).
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
			if ch.Hooknum != nil && ch.Table.Name != masq.TableIPv4 && ch.Table.Name != masq.TableIPv6 && !weftFilter(ch.Table) {
				if err := f(c, ch); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// weftFilter reports whether t is the vxlan backend's peer filter, whose
// drop of non-peers is no firewall closing the port to peers.
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
