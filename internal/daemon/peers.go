package daemon

import (
	"iter"
	"net/netip"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// peerSet holds the leases that passed the checks, by key. It is the single
// point where leases from the datastore become peers: a lease outside the
// Network, of another prefix length, VNI or backend type, or with an
// unusable public address is left out (logged once and counted), and a key
// that was a peer and is rewritten with such a value stops being one.
//
// It also keeps the peer table for the backend (tab, brought up to date by
// update). A change of a few leases among thousands changes only their
// rows, in place, and update returns them, instead of building every row
// again: a backend that takes rows (updater) is handed only those, others a
// copy of the table.
//
// A lease is kept as its key, which names its subnets, and its value: what
// the table is built from, and half the size of a whole subnet.Lease.
type peerSet struct {
	cfg    *subnet.Config
	lens   subnet.PrefixLens
	rej    *subnet.Rejections
	leases map[string]subnet.LeaseAttrs

	typ  string       // the lease type of the backend (subnet.LeaseType)
	self subnet.Lease // left out of the table
	tab  vtep.Table   // the table; changed in place, never handed over
	// touched holds the keys changed since tab was brought up to date,
	// each with its lease then (ok false: it was no peer).
	touched map[string]prior
	// rebuilds counts the tables built from every lease (for tests).
	rebuilds int
}

type prior struct {
	attrs subnet.LeaseAttrs
	ok    bool
}

// newPeerSet expects peers' subnets to have the prefix lengths of self's
// (the config's in etcd mode; the controller-manager's in Kubernetes mode).
// typ is the lease type of the backend (subnet.LeaseBackendType).
func newPeerSet(cfg *subnet.Config, self subnet.Lease, rej *subnet.Rejections, typ string) *peerSet {
	p := &peerSet{cfg: cfg, rej: rej, leases: map[string]subnet.LeaseAttrs{},
		typ: typ, self: self, touched: map[string]prior{}}
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
	if _, seen := p.touched[key]; !seen && p.tab != nil { // the first table is built in full
		old, had := p.leases[key]
		p.touched[key] = prior{old, had}
	}
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
	p.leases[key] = ev.Lease.Attrs
}

// lease is the lease kept as key and attrs.
func lease(key string, attrs subnet.LeaseAttrs) subnet.Lease {
	v4, v6, _ := subnet.ParseKey(key) // the key of a lease that passed the checks
	return subnet.Lease{Subnet: v4, IPv6Subnet: v6, Attrs: attrs}
}

// all yields every lease kept.
func (p *peerSet) all(yield func(subnet.Lease) bool) {
	for key, attrs := range p.leases {
		if !yield(lease(key, attrs)) {
			return
		}
	}
}

// rows is the table rows lease l gives.
func (p *peerSet) rows(l subnet.Lease) vtep.Table {
	return vtep.FromLeaseSeq(p.typ, 1, func(yield func(subnet.Lease) bool) { yield(l) }, p.self)
}

// update brings tab up to date with the leases now and returns the rows
// it changed; rebuilt says it built the table anew from every lease (the
// first table, a change of many leases, or a row that a touched key gave
// that a key that was not touched still gives), which has no list of rows.
// Either way tab is what vtep.FromLeaseSeq of the leases gives (where two
// leases give one subnet, that picks either's row, and so may this).
func (p *peerSet) update() (ups []vtep.Update, rebuilt bool) {
	defer p.untouch()
	if p.tab == nil || len(p.touched) > 16+len(p.leases)/8 {
		p.rebuild()
		return nil, true
	}
	var olds, news []vtep.Table
	given := map[netip.Prefix]bool{} // rows the touched keys give now
	for key, was := range p.touched {
		if was.ok {
			olds = append(olds, p.rows(lease(key, was.attrs)))
		}
		if attrs, ok := p.leases[key]; ok {
			rows := p.rows(lease(key, attrs))
			for q := range rows {
				given[q] = true
			}
			news = append(news, rows)
		}
	}
	// A row that a touched key gave and gives no more goes, unless another
	// lease gives it too (two leases may give one subnet in a datastore
	// written by hand or by an attacker): then the table is built in full.
	gone := map[netip.Prefix]bool{}
	for _, rows := range olds {
		for q := range rows {
			if !given[q] {
				gone[q] = true
			}
		}
	}
	if len(gone) > 0 {
		for l := range p.all {
			if gone[l.Subnet] || gone[l.IPv6Subnet] {
				for q := range p.rows(l) {
					if gone[q] {
						p.rebuild()
						return nil, true
					}
				}
			}
		}
	}
	for q := range gone {
		delete(p.tab, q)
		ups = append(ups, vtep.Update{Subnet: q, Gone: true})
	}
	for _, rows := range news {
		for q, v := range rows {
			if old, ok := p.tab[q]; !ok || old != v {
				p.tab[q] = v
				ups = append(ups, vtep.Update{Subnet: q, Peer: v})
			}
		}
	}
	return ups, false
}

// untouch forgets the touched keys; a map that held many (a change of many
// leases) is dropped rather than cleared, which would keep its room.
func (p *peerSet) untouch() {
	if len(p.touched) > 64 {
		p.touched = map[string]prior{}
		return
	}
	clear(p.touched)
}

func (p *peerSet) rebuild() {
	p.rebuilds++
	p.tab = vtep.FromLeaseSeq(p.typ, len(p.leases), iter.Seq[subnet.Lease](p.all), p.self)
}
