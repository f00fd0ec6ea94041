package daemon

import (
	"github.com/weft-net/weft/subnet"
)

// peerSet holds the leases that passed the checks, by key. It is the single
// point where leases from the datastore become peers: a lease outside the
// Network, of another prefix length, VNI or backend type, or with an
// unusable public address is left out (logged once and counted), and a key
// that was a peer and is rewritten with such a value stops being one.
type peerSet struct {
	cfg    *subnet.Config
	lens   subnet.PrefixLens
	rej    *subnet.Rejections
	leases map[string]subnet.Lease
}

// newPeerSet expects peers' subnets to have the prefix lengths of self's
// (the config's in etcd mode; the controller-manager's in Kubernetes mode).
func newPeerSet(cfg *subnet.Config, self subnet.Lease, rej *subnet.Rejections) *peerSet {
	p := &peerSet{cfg: cfg, rej: rej, leases: map[string]subnet.Lease{}}
	if self.Subnet.IsValid() {
		p.lens.V4 = self.Subnet.Bits()
	}
	if self.IPv6Subnet.IsValid() {
		p.lens.V6 = self.IPv6Subnet.Bits()
	}
	return p
}

// apply folds one event in.
func (p *peerSet) apply(ev subnet.Event) {
	key := ev.Lease.Key()
	if ev.Type == subnet.EventRemoved {
		p.rej.Forget(key)
		delete(p.leases, key)
		return
	}
	if err := p.cfg.CheckLease(ev.Lease, p.lens); err != nil {
		p.rej.Reject(key, subnet.RejectReason(err), err)
		delete(p.leases, key)
		return
	}
	p.rej.Forget(key)
	p.leases[key] = ev.Lease
}
