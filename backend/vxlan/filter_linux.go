package vxlan

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync/atomic"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/weft-net/weft/backend/nft"
	"github.com/weft-net/weft/vtep"
)

// FilterTable is the nftables table (family inet) in which the backend
// admits VXLAN datagrams from its peers only (see the package
// documentation).
const FilterTable = "weft-vxlan"

// The sets of the peers' underlay addresses, and the comments of the drop
// rules, which doctor and explain name.
const (
	PeerSet         = "peers"
	PeerSetV6       = "peers-v6"
	RuleNotPeer     = "weft: vxlan from a non-peer"
	RuleForeignSrc  = "weft: overlay source outside the cluster network"
	rulePeer        = "weft: vxlan from a peer"
	dropNotPeer     = "not_peer"
	dropForeignSrc  = "foreign_source"
	filterInputName = "input"
)

// filterSpec is the filter table for the devices, without set elements:
//
//	table inet weft-vxlan {
//		set peers { type ipv4_addr }
//		set peers-v6 { type ipv6_addr }
//		chain input { type filter hook input priority filter
//			meta nfproto ipv4 udp dport <Port> ip saddr @peers accept
//			meta nfproto ipv6 udp dport <Port> ip6 saddr @peers-v6 accept
//			udp dport <Port> counter drop
//		}
//		chain prerouting { type filter hook prerouting priority raw
//			iifname weft.1 meta nfproto ipv4 ip saddr != <Network> counter drop
//			iifname weft-v6.1 meta nfproto ipv6 ip6 saddr != <IPv6Network> counter drop
//		}
//	}
func filterSpec(c Config, devs []deviceSpec) nft.Table {
	input := []nft.Rule{
		{Comment: rulePeer, Exprs: nft.Concat(nfproto(unix.NFPROTO_IPV4), udpDport(c.Port), inSet(false, PeerSet), verdict(expr.VerdictAccept))},
		{Comment: rulePeer, Exprs: nft.Concat(nfproto(unix.NFPROTO_IPV6), udpDport(c.Port), inSet(true, PeerSetV6), verdict(expr.VerdictAccept))},
		{Comment: RuleNotPeer, Exprs: nft.Concat(udpDport(c.Port), []expr.Any{&expr.Counter{}}, verdict(expr.VerdictDrop))},
	}
	var pre []nft.Rule
	for _, d := range devs {
		n, proto := c.Network, byte(unix.NFPROTO_IPV4)
		if d.local.Is6() {
			n, proto = c.IPv6Network, unix.NFPROTO_IPV6
		}
		if !n.IsValid() {
			continue
		}
		pre = append(pre, nft.Rule{Comment: RuleForeignSrc, Exprs: nft.Concat(iifname(d.name), nfproto(proto),
			nft.NotMatch(n, false), []expr.Any{&expr.Counter{}}, verdict(expr.VerdictDrop))})
	}
	t := nft.Table{Name: FilterTable, Family: nftables.TableFamilyINet,
		Sets: []nft.Set{{Name: PeerSet, KeyType: nftables.TypeIPAddr}, {Name: PeerSetV6, KeyType: nftables.TypeIP6Addr}},
		Chains: []nft.Chain{{Name: filterInputName, Type: nftables.ChainTypeFilter,
			Hook: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Rules: input}}}
	if len(pre) > 0 {
		t.Chains = append(t.Chains, nft.Chain{Name: "prerouting", Type: nftables.ChainTypeFilter,
			Hook: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw, Rules: pre})
	}
	return t
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func udpDport(port int) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, uint16(port))},
	}
}

func inSet(ipv6 bool, set string) []expr.Any {
	off, size := nft.AddrOffset(ipv6, false)
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: size},
		&expr.Lookup{SourceRegister: 1, SetName: set},
	}
}

func iifname(name string) []expr.Any {
	b := make([]byte, 16)
	copy(b, name)
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b},
	}
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

// peerFilter keeps the filter table and its sets in step with the peer
// table: reconcile calls admit before it programs any route and prune after
// the routes of departed peers are gone. Its fields are Run's, but for the
// counters.
type peerFilter struct {
	netns string
	spec  nft.Table
	log   *slog.Logger
	// have is what the sets hold, as weft wrote it; nil: not known, read
	// it from the kernel.
	have    map[netip.Addr]bool
	checked bool // the table was found or written as wanted before
	repairs atomic.Uint64
}

// peerAddrs are the underlay addresses of the table's peers.
func peerAddrs(t vtep.Table) map[netip.Addr]bool {
	out := make(map[netip.Addr]bool, len(t))
	for _, p := range t {
		if p.Addr.IsValid() {
			out[p.Addr.Unmap()] = true
		}
	}
	return out
}

// admit makes sure the table is in place (with full, or the first time,
// checking it against the kernel and rewriting it, in one transaction with
// its elements, when it is not as wanted) and that the sets hold every
// peer of t.
func (f *peerFilter) admit(t vtep.Table, full bool) error {
	conn, done, err := nft.Dial(f.netns)
	if err != nil {
		return err
	}
	defer done()
	want := peerAddrs(t)
	if full || f.have == nil {
		ok, why, err := nft.Check(conn, f.spec)
		if err != nil {
			return err
		}
		if !ok {
			return f.rewrite(conn, want, why)
		}
		kernel, err := f.read(conn)
		if err != nil {
			return err
		}
		if f.have != nil && !maps.Equal(kernel, f.have) {
			f.repairs.Add(1)
			f.log.Warn("repaired the peer sets of the VXLAN port filter", "table", FilterTable)
		}
		f.have, f.checked = kernel, true
	}
	var add []netip.Addr
	for a := range want {
		if !f.have[a] {
			add = append(add, a)
		}
	}
	return f.write(conn, add, true)
}

// rewrite programs the whole table with the peers of want and those still
// admitted (prune takes those out after their routes).
func (f *peerFilter) rewrite(conn *nftables.Conn, want map[netip.Addr]bool, why string) error {
	for a := range f.have {
		want[a] = true
	}
	spec := f.spec
	spec.Sets = slices.Clone(spec.Sets)
	for a := range want {
		i := 0
		if a.Is6() {
			i = 1
		}
		spec.Sets[i].Elements = append(spec.Sets[i].Elements, a)
	}
	f.have = nil
	if err := nft.Program(conn, spec); err != nil {
		return err
	}
	repair := f.checked
	f.have, f.checked = want, true
	if repair {
		f.repairs.Add(1)
		f.log.Warn("repaired the VXLAN port filter", "table", FilterTable, "reason", why)
	} else {
		f.log.Info("VXLAN port filter in place: datagrams from peers only", "table", FilterTable, "peers", len(want))
	}
	return nil
}

// prune takes out the peers that are no longer in t.
func (f *peerFilter) prune(t vtep.Table) error {
	want := peerAddrs(t)
	var del []netip.Addr
	for a := range f.have {
		if !want[a] {
			del = append(del, a)
		}
	}
	if len(del) == 0 {
		return nil
	}
	conn, done, err := nft.Dial(f.netns)
	if err != nil {
		return err
	}
	defer done()
	return f.write(conn, del, false)
}

// write adds (or deletes) addrs in one transaction.
func (f *peerFilter) write(conn *nftables.Conn, addrs []netip.Addr, add bool) error {
	if len(addrs) == 0 {
		return nil
	}
	var v4, v6 []netip.Addr
	for _, a := range addrs {
		if a.Is6() {
			v6 = append(v6, a)
		} else {
			v4 = append(v4, a)
		}
	}
	op := conn.SetAddElements
	if !add {
		op = conn.SetDeleteElements
	}
	for _, s := range []struct {
		name  string
		addrs []netip.Addr
	}{{PeerSet, v4}, {PeerSetV6, v6}} {
		if len(s.addrs) == 0 {
			continue
		}
		if err := op(&nftables.Set{Table: f.spec.Ref(), Name: s.name}, nft.Elements(s.addrs)); err != nil {
			return err
		}
	}
	if err := conn.Flush(); err != nil {
		f.have = nil // read it again
		return fmt.Errorf("update the peer sets of table inet %s: %w", FilterTable, err)
	}
	for _, a := range addrs {
		if add {
			f.have[a] = true
		} else {
			delete(f.have, a)
		}
	}
	return nil
}

// read returns the addresses the sets hold.
func (f *peerFilter) read(conn *nftables.Conn) (map[netip.Addr]bool, error) {
	out := map[netip.Addr]bool{}
	for _, name := range []string{PeerSet, PeerSetV6} {
		els, err := conn.GetSetElements(&nftables.Set{Table: f.spec.Ref(), Name: name})
		if err != nil {
			return nil, fmt.Errorf("read set %s of table inet %s: %w", name, FilterTable, err)
		}
		for _, e := range els {
			if a, ok := netip.AddrFromSlice(e.Key); ok {
				out[a] = true
			}
		}
	}
	return out, nil
}

// FilterDrops reads the counters of the filter table's drop rules in the
// namespace at netns ("" for the current one), by the reason uvxlan counts
// the same drops under: "not_peer" (datagrams to the VXLAN port from a
// host that is not a peer) and "foreign_source" (frames out of the overlay
// device with a source outside the cluster network). A missing table
// reports nothing and no error.
func FilterDrops(netns string) (map[string]uint64, error) {
	conn, done, err := nft.Dial(netns)
	if err != nil {
		return nil, err
	}
	defer done()
	t := &nftables.Table{Name: FilterTable, Family: nftables.TableFamilyINet}
	out := map[string]uint64{}
	for _, chain := range []string{filterInputName, "prerouting"} {
		rules, err := conn.GetRules(t, &nftables.Chain{Name: chain, Table: t})
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read table inet %s: %w", FilterTable, err)
		}
		for _, r := range rules {
			c, _ := userdata.GetString(r.UserData, userdata.TypeComment)
			reason := map[string]string{RuleNotPeer: dropNotPeer, RuleForeignSrc: dropForeignSrc}[c]
			for _, e := range r.Exprs {
				if n, ok := e.(*expr.Counter); ok && reason != "" {
					out[reason] += n.Packets
				}
			}
		}
	}
	return out, nil
}

// RemoveFilter deletes the filter table from the namespace at netns (""
// for the current one), for a node that runs another dataplane or turned
// the filter off: its sets would no longer follow the peers. A missing
// table, or a kernel without nf_tables, is not an error.
func RemoveFilter(netns string) error {
	conn, done, err := nft.Dial(netns)
	if err != nil {
		return err
	}
	defer done()
	tables, err := conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if nfTablesMissing(err) {
		return nil // no nf_tables: no table either
	}
	if err != nil {
		return fmt.Errorf("list nftables tables: %w", err)
	}
	if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == FilterTable }) {
		return nil
	}
	conn.DelTable(&nftables.Table{Name: FilterTable, Family: nftables.TableFamilyINet})
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("delete table inet %s: %w", FilterTable, err)
	}
	return nil
}

// nfTablesMissing reports whether err says that the kernel has no
// nf_tables (no nfnetlink, or no nf_tables subsystem in it).
func nfTablesMissing(err error) bool {
	return errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EAFNOSUPPORT)
}

// probe reports whether nf_tables works in the namespace.
func probeNFTables(netns string) error {
	conn, done, err := nft.Dial(netns)
	if err != nil {
		return err
	}
	defer done()
	_, err = conn.ListTablesOfFamily(nftables.TableFamilyINet)
	return err
}
