package kernel

import (
	"net/netip"

	"github.com/weft-net/weft/vtep"
)

// EntryStep is a PeerStep that can also add and remove the entry of a
// single peer without reading the kernel, which lets Apply program a change
// in a table of thousands of peers with a handful of netlink calls. Add
// replaces an entry of the same peer; Remove of a missing entry succeeds.
type EntryStep interface {
	PeerStep
	Add(e vtep.Entry) error
	Remove(e vtep.Entry) error
}

// Apply programs the change from old, a table that the last Sync or Apply
// programmed in full, to next, writing only the rows that differ, in the
// per-peer order of Sync, without reading the kernel. When it cannot work
// incrementally (DirectRouting, whose routes depend on the underlay, or a
// step that is not an EntryStep) it falls back to Sync(next). Drift is
// Sync's job: Apply trusts that the kernel still holds old.
func (o *Overlay) Apply(old, next vtep.Table) (SyncStats, error) {
	return o.apply(next, func() vtep.Diff { return vtep.Compute(o.own(old), o.own(next)) })
}

// ApplyAt is Apply when old and next can differ only at the subnets in at
// (the rows a change of a few leases touched): it looks at those rows
// alone, so a change among thousands of peers costs time in proportion to
// the change, not to the table. old need hold only those rows; next must be
// the whole table, which the fallback to Sync programs.
func (o *Overlay) ApplyAt(old, next vtep.Table, at []netip.Prefix) (SyncStats, error) {
	return o.apply(next, func() vtep.Diff {
		own := make([]netip.Prefix, 0, len(at))
		for _, p := range at {
			if o.wants(p.Addr()) {
				own = append(own, p)
			}
		}
		return vtep.ComputeAt(o.ownAt(old, own), o.ownAt(next, own), own)
	})
}

// apply writes the diff that diff computes, or syncs next in full when it
// cannot work incrementally.
func (o *Overlay) apply(next vtep.Table, diff func() vtep.Diff) (SyncStats, error) {
	step, stepOK := o.opts.Step.(EntryStep)
	if o.opts.DirectRouting || (o.opts.Step != nil && !stepOK) {
		return o.Sync(next)
	}
	var st SyncStats
	d := diff()
	for _, e := range d.Remove {
		r := wantRoute(Peer{Entry: e}, o.link)
		r.Protocol = int(RouteProtocol) // the route weft wrote, no other owner's
		if err := o.delRoutes([]Route{r}, &st); err != nil {
			return st, err
		}
		if step != nil {
			if err := step.Remove(e); err != nil {
				return st, err
			}
			st.StepDel++
		}
		if err := o.delNeighbours([]Neighbour{{IP: Gateway(e.Subnet), MAC: e.Peer.MAC}}, &st); err != nil {
			return st, err
		}
	}
	for _, c := range d.Change {
		e := vtep.Entry{Subnet: c.Subnet, Peer: c.New}
		if err := o.addPeer(e, step, &st); err != nil {
			return st, err
		}
		if step != nil { // the old entry goes after the new one is in place
			if err := step.Remove(vtep.Entry{Subnet: c.Subnet, Peer: c.Old}); err != nil {
				return st, err
			}
			st.StepDel++
		}
	}
	for _, e := range d.Add {
		if err := o.addPeer(e, step, &st); err != nil {
			return st, err
		}
	}
	return st, nil
}

// addPeer writes one tunnelled peer: neighbour, step, route.
func (o *Overlay) addPeer(e vtep.Entry, step EntryStep, st *SyncStats) error {
	if err := o.setNeighbours([]Neighbour{{IP: Gateway(e.Subnet), MAC: e.Peer.MAC}}, st); err != nil {
		return err
	}
	if step != nil {
		if err := step.Add(e); err != nil {
			return err
		}
		st.StepSet++
	}
	return o.setRoutes([]Route{wantRoute(Peer{Entry: e}, o.link)}, st)
}

// ownAt returns the rows of t among at that this overlay handles.
func (o *Overlay) ownAt(t vtep.Table, at []netip.Prefix) vtep.Table {
	out := make(vtep.Table, len(at))
	for _, p := range at {
		if v, ok := t[p]; ok && o.carries(p, v) {
			out[p] = v
		}
	}
	return out
}

// own returns the rows of t that this overlay handles (its family, with an
// underlay address of the same family, as Sync selects them): t itself when
// it handles them all, the usual case, which saves two copies of the table
// per change (tables are never modified once handed over).
func (o *Overlay) own(t vtep.Table) vtep.Table {
	all := true
	for p, v := range t {
		if !o.carries(p, v) {
			all = false
			break
		}
	}
	if all {
		return t
	}
	out := make(vtep.Table, len(t))
	for p, v := range t {
		if o.carries(p, v) {
			out[p] = v
		}
	}
	return out
}
