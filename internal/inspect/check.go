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

// RenderRejected prints one line per rejected lease: its key, its node
// address and the reason.
func RenderRejected(w io.Writer, rs []Rejected) {
	for _, r := range rs {
		fmt.Fprintf(w, "rejected lease %s (node %s), weftd skips it too: %v\n", r.Lease.Key(), addrOrDash(r.Lease.Attrs.PublicIP), r.Err)
	}
}
