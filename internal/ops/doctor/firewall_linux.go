package doctor

import (
	"strings"

	"github.com/google/nftables"

	"github.com/weft-net/weft/backend/masq"
	"github.com/weft-net/weft/backend/vxlan"
)

// checkFirewall reports iptables-legacy tables, which `nft list ruleset`
// does not show. firewall/forward and firewall/input ask the kernel's
// trace (checkForward, checkInput); the forward trace ends in a chain
// after theirs, the input trace does not.
func checkFirewall(s *state) {
	if names, err := s.procNet("ip_tables_names"); err == nil && strings.TrimSpace(names) != "" {
		s.r.add("firewall/iptables-legacy", Warn, "check them with `iptables-legacy -S` (and migrate them to iptables-nft or nft)",
			"iptables-legacy tables %s are loaded: their rules run beside nftables, and `nft list ruleset` does not show them "+
				"(firewall/forward sees whether they let forwarded traffic through, firewall/input does not)", strings.Join(strings.Fields(names), ", "))
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
