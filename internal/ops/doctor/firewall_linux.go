package doctor

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/weft-net/weft/backend/masq"
	"github.com/weft-net/weft/backend/vxlan"
)

// checkFirewall looks for other firewalls that drop forwarded pod traffic:
// nftables chains on the forward hook with policy drop (iptables-nft's
// FORWARD included, where Docker sets DROP) and no rule, in them or in a
// chain they jump to for every packet (weft's WEFT-FWD, Flannel's
// FLANNEL-FWD), that accepts the cluster network by address; and
// iptables-legacy tables, which nftables does not show (their filter
// FORWARD policy is named as a suspect, see legacyNote).
func checkFirewall(s *state) {
	network := "the cluster network"
	if s.Config != nil {
		network = s.Config.Network.String()
	}
	found := 0
	err := s.hookChains(nftables.ChainHookForward, func(c *nftables.Conn, ch *nftables.Chain) error {
		if ch.Policy == nil || *ch.Policy != nftables.ChainPolicyDrop {
			return nil
		}
		found++
		rules, err := c.GetRules(ch.Table, ch)
		accepts := s.Config != nil && acceptsNetwork(rules, s.Config.Network)
		for _, r := range rules {
			if target := jumpTarget(r); target != "" && err == nil {
				var sub []*nftables.Rule
				sub, err = c.GetRules(ch.Table, &nftables.Chain{Name: target, Table: ch.Table})
				accepts = accepts || s.Config != nil && acceptsNetwork(sub, s.Config.Network)
			}
		}
		if err != nil {
			return err
		}
		where := fmt.Sprintf("table %s %s chain %s", familyName(ch.Table.Family), ch.Table.Name, ch.Name)
		if accepts {
			s.r.ok("firewall/forward", "%s has policy drop but a rule accepts %s", where, network)
			return nil
		}
		t := familyName(ch.Table.Family) + " " + ch.Table.Name
		fix := fmt.Sprintf("nft insert rule %s %s ip saddr %s accept; nft insert rule %s %s ip daddr %s accept", t, ch.Name, network, t, ch.Name, network)
		if ch.Table.Name == "filter" && ch.Name == "FORWARD" {
			fix = fmt.Sprintf("run weftd with --iptables-forward-rules (the default) and without EnableNFTables: it keeps chain WEFT-FWD accepting %s here; "+
				"or iptables -I FORWARD -s %s -j ACCEPT; iptables -I FORWARD -d %s -j ACCEPT", network, network, network)
		}
		s.r.add("firewall/forward", Fail, fix,
			"%s has policy drop and no rule accepting %s: forwarded pod traffic is dropped there, whatever other tables accept", where, network)
		return nil
	})
	if err != nil {
		s.r.add("firewall/forward", Warn, "", "read nftables chains: %v", err)
	} else if found == 0 {
		s.r.ok("firewall/forward", "no other forward chain with policy drop")
	}
	if names, err := s.procNet("ip_tables_names"); err == nil && strings.TrimSpace(names) != "" {
		tables := strings.Fields(names)
		s.r.add("firewall/iptables-legacy", Warn, "check them with `iptables-legacy -S` (and migrate them to iptables-nft or nft)",
			"iptables-legacy tables %s are loaded: their rules run beside nftables, and neither `nft list ruleset` nor the kernel's trace sees them%s",
			strings.Join(tables, ", "), legacyNote(s, tables))
	}
}

// hookChains calls f, in the node's namespace, for each nftables base
// chain on hook that is not in weft's masquerade tables or in the kernel
// VXLAN backend's port filter (checkPeerFilter reports that one).
func (s *state) hookChains(hook *nftables.ChainHook, f func(c *nftables.Conn, ch *nftables.Chain) error) error {
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
			if ch.Hooknum == nil || *ch.Hooknum != *hook || ch.Table.Name == masq.TableIPv4 || ch.Table.Name == masq.TableIPv6 || weftFilter(ch.Table) {
				continue
			}
			if err := f(c, ch); err != nil {
				return err
			}
		}
		return nil
	})
}

// weftFilter reports whether t is the vxlan backend's own filter (table
// inet weft-vxlan), which firewall/vxlan-peers reports on: its drop of
// non-peers is no firewall closing the port to peers.
func weftFilter(t *nftables.Table) bool {
	return t.Name == vxlan.FilterTable && t.Family == nftables.TableFamilyINet
}

// jumpTarget is the chain a rule jumps (or goes) to for every packet (a
// rule with no expression but a counter and the verdict), or "".
func jumpTarget(r *nftables.Rule) string {
	target := ""
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Counter:
		case *expr.Verdict:
			if e.Kind == expr.VerdictJump || e.Kind == expr.VerdictGoto {
				target = e.Chain
			}
		default:
			return ""
		}
	}
	return target
}

// acceptsNetwork reports whether a rule matches an address prefix that
// covers the network and accepts. nft matches a prefix by loading only its
// leading bytes (ip saddr 10.244.0.0/16 compares 2 bytes), masked when the
// length is not a multiple of 8; iptables-nft loads 4 bytes and masks.
func acceptsNetwork(rules []*nftables.Rule, network netip.Prefix) bool {
	net4 := network.Masked().Addr().AsSlice()
	for _, r := range rules {
		covers, accept := false, false
		var mask []byte
		for _, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Bitwise:
				mask = e.Mask
			case *expr.Cmp:
				covers = covers || e.Op == expr.CmpOpEq && prefixCovers(e.Data, mask, net4, network.Bits())
				mask = nil
			case *expr.Verdict:
				accept = e.Kind == expr.VerdictAccept
			}
		}
		if covers && accept {
			return true
		}
	}
	return false
}

// prefixCovers reports whether comparing the leading len(data) bytes of an
// address, under mask (nil: all ones), with data matches every address of
// the network net4/bits.
func prefixCovers(data, mask, net4 []byte, bits int) bool {
	if len(data) == 0 || len(data) > len(net4) || mask != nil && len(mask) != len(data) {
		return false
	}
	ones := 0
	for i := range data {
		m := byte(0xff)
		if mask != nil {
			m = mask[i]
		}
		if net4[i]&m != data[i] {
			return false
		}
		for b := m; b != 0; b <<= 1 {
			ones++
		}
	}
	return ones <= bits
}
