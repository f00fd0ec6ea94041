package inspect

import (
	"fmt"
	"io"

	"github.com/weft-net/weft/subnet"
)

// Rejected is a lease that weftd does not take as a peer, and why.
type Rejected struct {
	Lease subnet.Lease
	Err   error // a *subnet.RejectError
}

// CheckLeases splits ls as weftd on the node holding self does: the leases
// that become peers (and self, which is never checked) and those that
// subnet.Config.CheckLease rejects, with peers' prefix lengths expected to
// be self's. A nil cfg (the config could not be read) accepts every lease.
func CheckLeases(cfg *subnet.Config, self subnet.Lease, ls []subnet.Lease) (ok []subnet.Lease, rejected []Rejected) {
	var lens subnet.PrefixLens
	if self.Subnet.IsValid() {
		lens.V4 = self.Subnet.Bits()
	}
	if self.IPv6Subnet.IsValid() {
		lens.V6 = self.IPv6Subnet.Bits()
	}
	for _, l := range ls {
		if cfg != nil && l.Key() != self.Key() {
			if err := cfg.CheckLease(l, lens); err != nil {
				rejected = append(rejected, Rejected{Lease: l, Err: err})
				continue
			}
		}
		ok = append(ok, l)
	}
	return ok, rejected
}

// SelfCandidates are the leases that may be this node's own: those that
// pass every check of cfg but the prefix length (a node's own length is the
// one the others are held to). Looking for the node's own lease only among
// them keeps a hostile lease such as 0.0.0.0-1, whose subnet holds every
// address, from being taken for it. A nil cfg keeps every lease.
func SelfCandidates(cfg *subnet.Config, ls []subnet.Lease) []subnet.Lease {
	if cfg == nil {
		return ls
	}
	var out []subnet.Lease
	for _, l := range ls {
		if cfg.CheckLease(l, subnet.PrefixLens{V4: l.Subnet.Bits(), V6: l.IPv6Subnet.Bits()}) == nil {
			out = append(out, l)
		}
	}
	return out
}

// RenderRejected prints one line per rejected lease: its key, its node
// address and the reason.
func RenderRejected(w io.Writer, rs []Rejected) {
	for _, r := range rs {
		fmt.Fprintf(w, "rejected lease %s (node %s), weftd skips it too: %v\n", r.Lease.Key(), addrOrDash(r.Lease.Attrs.PublicIP), r.Err)
	}
}
