package vxlan

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/vtep"
)

// TestUpdateRows hands the backend changes row by row (Update: new peers of
// both families, a peer moved to another address and MAC, a peer removed,
// and a row for this node's own subnet, which must stay out) and checks
// that the incremental reconcile leaves the kernel exactly where a full one
// of the resulting table does: a full reconcile afterwards, by a second
// backend Set that table, finds nothing to change. Then a whole table Set
// after queued rows (the rows are dropped), the same way. It calls
// reconcile itself, so that no notification turns a sync into a full one.
// With DirectRouting, where the overlay syncs the whole table instead of
// writing rows, the same holds (the other peers' routes survive a change).
// Each time the VXLAN port filter's sets, which a change made row by row
// writes at those rows' addresses only, hold exactly the table's peers.
func TestUpdateRows(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(map[bool]string{false: "encapsulated", true: "DirectRouting"}[direct], func(t *testing.T) { testUpdateRows(t, direct) })
	}
}

func testUpdateRows(t *testing.T, direct bool) {
	u := nettest.NewUnderlay(t, ul4, 0)
	n1 := newNode(t, u, 1)
	p, a := netip.MustParsePrefix, netip.MustParseAddr
	cfg := n1.config()
	cfg.DirectRouting = direct
	b := newBackend(t, cfg)
	b.Set(peerTable())
	if err := b.reconcile(true); err != nil {
		t.Fatal(err)
	}
	ups := []vtep.Update{
		{Subnet: p("10.244.3.0/24"), Peer: vtep.Peer{MAC: mac("0a:00:00:00:00:03"), Addr: a("192.168.77.3")}},
		{Subnet: p("fd00:10:244:3::/64"), Peer: vtep.Peer{MAC: mac("0a:00:00:00:00:03"), Addr: a("fd77::3")}},
		{Subnet: p("10.244.2.0/24"), Peer: vtep.Peer{MAC: mac("0a:00:00:00:00:22"), Addr: a("192.168.77.22")}},
		{Subnet: p("fd00:10:244:2::/64"), Gone: true},
		{Subnet: n1.Subnet, Peer: vtep.Peer{MAC: mac("0a:00:00:00:00:01"), Addr: a("192.168.77.1")}},
	}
	want := peerTable()
	for _, up := range ups[:4] {
		if up.Gone {
			delete(want, up.Subnet)
		} else {
			want[up.Subnet] = up.Peer
		}
	}
	check := func(step string, want vtep.Table) {
		t.Helper()
		if err := b.reconcile(false); err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(b.peers.want, want) {
			t.Errorf("%s: the backend's table %v, want %v", step, b.peers.want, want)
		}
		if got, w := filterSets(t, n1), peerAddrs(want); !maps.Equal(got, w) {
			t.Errorf("%s: the filter's sets hold %v, want %v", step, slices.SortedFunc(maps.Keys(got), netip.Addr.Compare), slices.SortedFunc(maps.Keys(w), netip.Addr.Compare))
		}
		before4, before6 := state(t, n1.NS, "weft.1"), state(t, n1.NS, "weft-v6.1")
		// Direct routes go through the underlay device, not the overlay's.
		routes := func() []string {
			return append(lines(t, n1.NS, "ip", "-4", "route", "show"), lines(t, n1.NS, "ip", "-6", "route", "show")...)
		}
		beforeRoutes := routes()
		b2 := newBackend(t, cfg)
		b2.Set(maps.Clone(want))
		if err := b2.reconcile(true); err != nil {
			t.Fatal(err)
		}
		if got := state(t, n1.NS, "weft.1"); !got.equal(before4) {
			t.Errorf("%s: IPv4 state after the incremental reconcile:\n%s\na full one of the table made it:\n%s", step, before4, got)
		}
		if got := state(t, n1.NS, "weft-v6.1"); !got.equal(before6) {
			t.Errorf("%s: IPv6 state after the incremental reconcile:\n%s\na full one of the table made it:\n%s", step, before6, got)
		}
		if got := routes(); !(kernelState{Route: got}).equal(kernelState{Route: beforeRoutes}) {
			t.Errorf("%s: routes after the incremental reconcile:\n%s\na full one of the table made them:\n%s", step,
				strings.Join(beforeRoutes, "\n"), strings.Join(got, "\n"))
		}
	}
	b.Update(ups[:2])
	b.Update(ups[2:])
	check("rows", want)

	b.Update([]vtep.Update{{Subnet: p("10.244.9.0/24"), Peer: vtep.Peer{MAC: mac("0a:00:00:00:00:09"), Addr: a("192.168.77.9")}}})
	next := vtep.Table{p("10.244.3.0/24"): want[p("10.244.3.0/24")], p("10.244.4.0/24"): {MAC: mac("0a:00:00:00:00:04"), Addr: a("192.168.77.4")}}
	b.Set(next)
	check("a whole table after rows", next)

	b.Update([]vtep.Update{{Subnet: p("10.244.4.0/24"), Gone: true}})
	delete(next, p("10.244.4.0/24"))
	check("rows after a whole table", next)

	// A peer moved to the address of another, then that other gone: the
	// address stays admitted while a row uses it.
	shared := next[p("10.244.3.0/24")]
	b.Update([]vtep.Update{{Subnet: p("10.244.5.0/24"), Peer: vtep.Peer{MAC: mac("0a:00:00:00:00:05"), Addr: shared.Addr}}})
	next[p("10.244.5.0/24")] = vtep.Peer{MAC: mac("0a:00:00:00:00:05"), Addr: shared.Addr}
	check("two rows at one address", next)
	b.Update([]vtep.Update{{Subnet: p("10.244.3.0/24"), Gone: true}})
	delete(next, p("10.244.3.0/24"))
	check("one of them gone", next)
}

// filterSets is what the VXLAN port filter's sets on nd hold.
func filterSets(t *testing.T, nd *node) map[netip.Addr]bool {
	t.Helper()
	out := map[netip.Addr]bool{}
	for _, set := range []string{PeerSet, PeerSetV6} {
		s := nettest.MustRun(t, nd, "nft", "list", "set", "inet", FilterTable, set)
		i := strings.Index(s, "elements = {")
		if i < 0 {
			continue
		}
		s = s[i+len("elements = {"):]
		s = s[:strings.Index(s, "}")]
		for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' }) {
			out[netip.MustParseAddr(f)] = true
		}
	}
	return out
}
