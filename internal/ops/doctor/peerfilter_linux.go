package doctor

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"

	"github.com/weft-net/weft/backend/vxlan"
	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/subnet"
)

// peerFilter is what table inet weft-vxlan holds: the addresses its sets
// admit and what its drop rules counted.
type peerFilter struct {
	found    bool
	admitted map[netip.Addr]bool
	drops    map[string]uint64
}

func (s *state) readPeerFilter() (peerFilter, error) {
	var f peerFilter
	err := s.Do.Run(func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(tables, func(t *nftables.Table) bool { return t.Name == vxlan.FilterTable })
		if i < 0 {
			return nil
		}
		f.found, f.admitted = true, map[netip.Addr]bool{}
		for _, name := range []string{vxlan.PeerSet, vxlan.PeerSetV6} {
			els, err := c.GetSetElements(&nftables.Set{Table: tables[i], Name: name})
			if err != nil {
				return fmt.Errorf("set %s: %w", name, err)
			}
			for _, e := range els {
				if a, ok := netip.AddrFromSlice(e.Key); ok {
					f.admitted[a] = true
				}
			}
		}
		f.drops, err = vxlan.FilterDrops("")
		return err
	})
	return f, err
}

// checkPeerFilter reports whether weft's kernel VXLAN node admits VXLAN
// datagrams from its peers only (table inet weft-vxlan, see backend/vxlan),
// with every peer's address in its sets, and what its rules dropped; on
// any other node, that no such table is left behind, since its sets follow
// no one there.
func checkPeerFilter(s *state) {
	const name = "firewall/vxlan-peers"
	weftVXLAN := s.k != nil && s.k.Device.Kind == inspect.KindVXLAN && strings.HasPrefix(s.k.Device.Name, "weft")
	f, err := s.readPeerFilter()
	switch {
	case err != nil:
		s.r.add(name, Warn, "", "read table inet %s: %v", vxlan.FilterTable, err)
		return
	case !weftVXLAN && f.found:
		s.r.add(name, Warn, "nft delete table inet "+vxlan.FilterTable,
			"table inet %s is left from a kernel VXLAN node: this node runs no weft VXLAN device, so its peer sets follow no one", vxlan.FilterTable)
		return
	case !weftVXLAN:
		return
	case !f.found:
		s.r.add(name, Warn, "run weftd with --vxlan-peer-filter (the default) on a kernel with nf_tables",
			"table inet %s is missing: the VXLAN port accepts datagrams from any host, which can put frames with any source into pods", vxlan.FilterTable)
		return
	}
	var missing []string
	n := 0
	for _, l := range s.peers() {
		if l.Attrs.BackendType != subnet.BackendTypeVXLAN {
			continue
		}
		for _, a := range []netip.Addr{l.Attrs.PublicIP, l.Attrs.PublicIPv6} {
			if !a.IsValid() || a.IsUnspecified() {
				continue
			}
			n++
			if !f.admitted[a] {
				missing = append(missing, a.String())
			}
		}
	}
	if len(missing) > 0 {
		s.r.add(name, Fail, "check weftd's log (it adds a peer before its route; a failing nftables write is retried every second)",
			"table inet %s does not admit peers %s: their VXLAN datagrams are dropped by rule %q", vxlan.FilterTable, strings.Join(missing, ", "), vxlan.RuleNotPeer)
		return
	}
	s.r.ok(name, "table inet %s admits VXLAN datagrams from the %d peer addresses only; dropped so far: %d by rule %q, %d by rule %q",
		vxlan.FilterTable, n, f.drops["not_peer"], vxlan.RuleNotPeer, f.drops["foreign_source"], vxlan.RuleForeignSrc)
}
