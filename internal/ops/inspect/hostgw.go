package inspect

import (
	"fmt"
	"io"
	"net/netip"
	"slices"
	"text/tabwriter"

	"github.com/weft-net/weft/vtep"
)

// Verdicts of a host-gw peer row, besides OK, Missing and Stale.
const (
	OffLink      = "off-link: not on this node's L2 segment, host-gw cannot route it"
	WrongNextHop = "route via another address than the peer's"
)

// HostGWPeer is one remote subnet of a host-gw node: the peer's public
// address from its lease, the route the kernel holds, and whether the peer
// is on-link.
type HostGWPeer struct {
	Subnet  netip.Prefix
	Want    netip.Addr // the lease's public address; invalid when no lease asks
	Route   *Route     // weft's route (proto 87), nil when none
	OnLink  bool
	Verdict string
}

// CompareHostGW lines up the host-gw table with weft's routes (routes of
// RouteProtocol) and each peer's reachability, sorted by subnet. onLink
// reports whether an address is on-link from this node.
func CompareHostGW(routes []Route, want vtep.Table, onLink func(netip.Addr) bool) []HostGWPeer {
	subnets := map[netip.Prefix]bool{}
	for p := range want {
		subnets[p] = true
	}
	for _, r := range routes {
		if r.Gw.IsValid() {
			subnets[r.Dst] = true
		}
	}
	var out []HostGWPeer
	for p := range subnets {
		row := HostGWPeer{Subnet: p}
		if v, ok := want[p]; ok {
			row.Want = v.Addr
			row.OnLink = onLink(v.Addr)
		}
		if i := slices.IndexFunc(routes, func(r Route) bool { return r.Dst == p }); i >= 0 {
			row.Route = &routes[i]
		}
		row.Verdict = hostGWVerdict(row)
		out = append(out, row)
	}
	slices.SortFunc(out, func(a, b HostGWPeer) int { return a.Subnet.Addr().Compare(b.Subnet.Addr()) })
	return out
}

func hostGWVerdict(r HostGWPeer) string {
	switch {
	case !r.Want.IsValid():
		return Stale
	case !r.OnLink:
		return OffLink
	case r.Route == nil:
		return Missing
	case r.Route.Gw != r.Want:
		return WrongNextHop
	}
	return OK
}

// HostGWMismatches counts the rows that are not OK.
func HostGWMismatches(ps []HostGWPeer) int {
	n := 0
	for _, p := range ps {
		if p.Verdict != OK {
			n++
		}
	}
	return n
}

// RenderHostGWPeers prints one line per host-gw peer.
func RenderHostGWPeers(w io.Writer, ps []HostGWPeer) error {
	fmt.Fprintln(w, "backend host-gw: each peer subnet routed via the peer's public address (no device, no encapsulation)")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SUBNET\tROUTE VIA\tLEASE (NODE)\tON-LINK\tSTATUS")
	for _, p := range ps {
		via, on := "-", "-"
		if p.Route != nil {
			via = addrOrDash(p.Route.Gw)
		}
		if p.Want.IsValid() {
			on = fmt.Sprint(p.OnLink)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Subnet, via, addrOrDash(p.Want), on, p.Verdict)
	}
	return tw.Flush()
}
