package inspect

import (
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// Verdicts of a peer row.
const (
	OK            = "ok"
	Missing       = "missing: no route"           // in the datastore, not programmed
	Stale         = "stale: no lease"             // programmed, not in the datastore
	NoNeighbour   = "no neighbour for gateway"    // route without its permanent neighbour
	WrongMAC      = "wrong VTEP MAC"              // neighbour MAC differs from the lease
	NoFDB         = "no FDB entry for VTEP MAC"   // vxlan: nothing tells the kernel where to send
	WrongUnderlay = "FDB points to wrong address" // vxlan: FDB dst differs from the lease
	WrongGateway  = "route via wrong gateway"
)

// Peer is one remote subnet: what the datastore wants and what the kernel
// holds for it.
type Peer struct {
	Subnet   netip.Prefix
	Want     *vtep.Peer // nil when no lease asks for it
	Route    *Route     // nil when no route
	MAC      subnet.MAC // neighbour MAC for the route's gateway (zero: none)
	Underlay []netip.Addr
	Verdict  string
}

// SelfLease finds the node's own lease from its kernel state: the lease
// whose subnet holds the overlay device's address, or whose public address
// is the device's local address.
func SelfLease(ls []subnet.Lease, k *Kernel) (subnet.Lease, bool) {
	if a, ok := k.OwnSubnetAddr(); ok {
		if l, ok := LeaseFor(ls, a); ok {
			return l, true
		}
	}
	if k.Device.Local.IsValid() {
		for _, l := range ls {
			if l.Attrs.PublicIP == k.Device.Local {
				return l, true
			}
		}
	}
	return subnet.Lease{}, false
}

// Compare lines up the wanted table (from the leases) with the kernel's
// routes on the overlay device, sorted by subnet. A TAP device keeps its
// FDB in weftd, so only routes and neighbours are checked for it.
func Compare(k *Kernel, want vtep.Table) []Peer {
	subnets := map[netip.Prefix]bool{}
	for p := range want {
		subnets[p] = true
	}
	for _, r := range k.Routes {
		if r.Gw.IsValid() && r.Dst.Addr().Is4() == r.Gw.Is4() {
			subnets[r.Dst] = true
		}
	}
	var out []Peer
	for p := range subnets {
		out = append(out, comparePeer(k, p, want))
	}
	slices.SortFunc(out, func(a, b Peer) int { return a.Subnet.Addr().Compare(b.Subnet.Addr()) })
	return out
}

func comparePeer(k *Kernel, p netip.Prefix, want vtep.Table) Peer {
	row := Peer{Subnet: p}
	if v, ok := want[p]; ok {
		row.Want = &v
	}
	if r, ok := k.route(p); ok {
		row.Route = &r
		if n, ok := k.neighbour(r.Gw); ok {
			row.MAC = n.MAC
		}
		row.Underlay = k.fdb(row.MAC)
	}
	row.Verdict = verdict(k.Device.Kind, row)
	return row
}

func verdict(kind string, r Peer) string {
	switch {
	case r.Want == nil:
		return Stale
	case r.Route == nil:
		return Missing
	case r.Route.Gw != r.Subnet.Masked().Addr():
		return WrongGateway
	case r.MAC.IsZero():
		return NoNeighbour
	case r.MAC != r.Want.MAC:
		return WrongMAC
	case kind != KindVXLAN:
		return OK
	case len(r.Underlay) == 0:
		return NoFDB
	case !slices.Contains(r.Underlay, r.Want.Addr):
		return WrongUnderlay
	}
	return OK
}

// Mismatches counts the rows that are not OK.
func Mismatches(ps []Peer) int {
	n := 0
	for _, p := range ps {
		if p.Verdict != OK {
			n++
		}
	}
	return n
}

// RenderPeers prints the device and one line per peer.
func RenderPeers(w io.Writer, k *Kernel, ps []Peer) error {
	d := k.Device
	switch d.Kind {
	case KindVXLAN:
		fmt.Fprintf(w, "device %s: vxlan VNI %d port %d local %s dev %s, MAC %s, MTU %d\n", d.Name, d.VNI, d.Port, addrOrDash(d.Local), d.Underlay, d.MAC, d.MTU)
	default:
		fmt.Fprintf(w, "device %s: TAP of weft's userspace VTEP (FDB kept in weftd), MAC %s, MTU %d\n", d.Name, d.MAC, d.MTU)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SUBNET\tROUTE VIA\tNEIGH MAC\tFDB DST\tLEASE (MAC @ NODE)\tSTATUS")
	for _, p := range ps {
		via, mac, fdb, lease := "-", "-", "-", "-"
		if p.Route != nil {
			via = addrOrDash(p.Route.Gw)
		}
		if !p.MAC.IsZero() {
			mac = p.MAC.String()
		}
		if d.Kind != KindVXLAN {
			fdb = "(weftd)"
		} else if len(p.Underlay) > 0 {
			fdb = joinAddrs(p.Underlay)
		}
		if p.Want != nil {
			lease = p.Want.MAC.String() + " @ " + p.Want.Addr.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.Subnet, via, mac, fdb, lease, p.Verdict)
	}
	return tw.Flush()
}

func joinAddrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ",")
}
