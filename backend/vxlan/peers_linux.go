package vxlan

import (
	"maps"
	"net/netip"

	"github.com/weft-net/weft/backend/kernel"
	"github.com/weft-net/weft/vtep"
)

// peerState is the backend's own peer table, which it changes in place as
// the daemon hands it changes row by row (Update), and what it needs to
// program the next change without comparing whole tables: the rows changed
// since the table was last programmed, with their value then. Owned by Run.
type peerState struct {
	want vtep.Table // the table to program, this node's rows left out; nil before the first
	// done says a reconcile programmed want (as it was then) once.
	done bool
	// undo holds, for each row changed since the last reconcile that
	// succeeded, its value then (ok false: no row); not kept while whole.
	undo map[netip.Prefix]row
	// whole says a whole table was set since; prev is then the table
	// programmed before it (nil: none).
	whole bool
	prev  vtep.Table
	// fdb counts the FDB entries the programmed table wants (the drift
	// rules'), kept up to date with each change rather than built again.
	fdb map[fdbEntry]int
	// addrs counts the rows of the programmed table by underlay address
	// (unmapped), kept up to date like fdb: the VXLAN port filter's sets
	// follow it one changed row at a time.
	addrs map[netip.Addr]int
}

type row struct {
	peer vtep.Peer
	ok   bool
}

// Update hands the backend changes to rows of the table it was last Set
// (see kernel.Desired.Queue): the daemon's way of telling it a change
// among thousands of peers. It never blocks.
func (b *Backend) Update(ups []vtep.Update) { b.Desired.Queue(ups) }

// take applies what was handed over since the last take to want, leaving
// out the rows self says are this node's.
func (s *peerState) take(d *kernel.Desired, self func(netip.Prefix, vtep.Peer) bool) {
	set, ups := d.Take()
	if set != nil {
		if !s.whole && s.done {
			s.revert()
			s.prev = s.want
		}
		s.want = maps.Clone(*set)
		maps.DeleteFunc(s.want, self)
		s.whole, s.undo = true, nil
	}
	if s.want == nil && len(ups) > 0 {
		s.want = vtep.Table{}
	}
	for _, u := range ups {
		if !s.whole {
			if _, noted := s.undo[u.Subnet]; !noted {
				if s.undo == nil {
					s.undo = map[netip.Prefix]row{}
				}
				v, ok := s.want[u.Subnet]
				s.undo[u.Subnet] = row{v, ok}
			}
		}
		if u.Gone || self(u.Subnet, u.Peer) {
			delete(s.want, u.Subnet)
		} else {
			s.want[u.Subnet] = u.Peer
		}
	}
}

// revert turns want back into the table last programmed.
func (s *peerState) revert() {
	for p, r := range s.undo {
		if r.ok {
			s.want[p] = r.peer
		} else {
			delete(s.want, p)
		}
	}
	s.undo = nil
}

// change is what turns the programmed table into want: the old and new
// values of the rows at (old holds only those, next is the whole table), or, with at nil,
// the whole tables. ok is false when it is not known (nothing programmed
// yet, or a whole table replaced one that was not): then sync in full.
// same says want is the table programmed last.
type change struct {
	old, next vtep.Table
	at        []netip.Prefix
	ok, same  bool
}

func (s *peerState) change() change {
	switch {
	case !s.done:
		return change{}
	case s.whole && s.prev == nil:
		return change{}
	case s.whole:
		return change{old: s.prev, next: s.want, ok: true}
	}
	// next is the whole table: ApplyAt reads only the rows at at, but
	// syncs next in full where it cannot work row by row (DirectRouting).
	c := change{old: vtep.Table{}, next: s.want, at: make([]netip.Prefix, 0, len(s.undo)), ok: true, same: len(s.undo) == 0}
	for p, r := range s.undo {
		c.at = append(c.at, p)
		if r.ok {
			c.old[p] = r.peer
		}
	}
	return c
}

// addrDelta is, for a change made row by row (c.at), the underlay
// addresses of the rows it writes, and those that no row of c.next uses
// once it is made; ok is false for any other change (then the filter
// compares whole tables).
func (s *peerState) addrDelta(c change) (add, gone []netip.Addr, ok bool) {
	if !c.ok || c.at == nil || s.addrs == nil {
		return nil, nil, false
	}
	d := map[netip.Addr]int{}
	for _, p := range c.at {
		if v, ok := c.old[p]; ok && v.Addr.IsValid() {
			d[v.Addr.Unmap()]--
		}
		if v, ok := c.next[p]; ok && v.Addr.IsValid() {
			a := v.Addr.Unmap()
			d[a]++
			add = append(add, a)
		}
	}
	for a, n := range d {
		if s.addrs[a]+n <= 0 {
			gone = append(gone, a)
		}
	}
	return add, gone, true
}

// programmed records that want is in the kernel.
func (s *peerState) programmed() {
	if s.whole || s.fdb == nil || s.addrs == nil {
		s.fdb = make(map[fdbEntry]int, len(s.want))
		s.addrs = make(map[netip.Addr]int, len(s.want))
		for _, v := range s.want {
			s.count(v, 1)
		}
	} else {
		for p, r := range s.undo {
			if r.ok {
				s.count(r.peer, -1)
			}
			if v, ok := s.want[p]; ok {
				s.count(v, 1)
			}
		}
	}
	s.done, s.whole, s.prev, s.undo = true, false, nil, nil
}

// count adds n to the counts of v's FDB entry and underlay address.
func (s *peerState) count(v vtep.Peer, n int) {
	e := fdbEntry{MAC: v.MAC, Dst: v.Addr}
	if s.fdb[e] += n; s.fdb[e] <= 0 {
		delete(s.fdb, e)
	}
	if !v.Addr.IsValid() {
		return
	}
	a := v.Addr.Unmap()
	if s.addrs[a] += n; s.addrs[a] <= 0 {
		delete(s.addrs, a)
	}
}
