package nft

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync/atomic"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// AddrSets keeps a table whose two address sets (one per family) must hold
// exactly what a dataplane's peer table says, written in steps the caller
// orders around its routes: Admit adds what is missing (before any route),
// Prune takes out what went (after the routes). Spec's Sets are the IPv4
// set first, then the IPv6 one; their elements are ignored. An AddrSets is
// used by one goroutine, but for Repairs.
type AddrSets struct {
	NetNS string
	Spec  Table
	Log   *slog.Logger
	// What the operations are called in logs ("the VXLAN port filter").
	What string

	have    map[netip.Addr]bool // what the sets hold; nil: read it
	checked bool                // the table was in place once
	repairs atomic.Uint64
}

// Known reports whether the AddrSets knows what the sets hold: an Admit
// read or wrote them and no write failed since. Add and Drop need it.
func (s *AddrSets) Known() bool { return s.have != nil }

// Add adds those of addrs the sets do not hold: Admit for a change whose
// new addresses the caller knows, without going through every peer's.
func (s *AddrSets) Add(addrs []netip.Addr) error {
	return s.change(addrs, true)
}

// Drop takes out those of addrs the sets hold: Prune for a change whose
// departed addresses the caller knows.
func (s *AddrSets) Drop(addrs []netip.Addr) error {
	return s.change(addrs, false)
}

func (s *AddrSets) change(addrs []netip.Addr, add bool) error {
	if s.have == nil {
		return fmt.Errorf("%s: what the sets hold is not known", s.What)
	}
	todo := slices.DeleteFunc(slices.Clone(addrs), func(a netip.Addr) bool { return s.have[a] == add })
	slices.SortFunc(todo, netip.Addr.Compare)
	todo = slices.Compact(todo)
	if len(todo) == 0 {
		return nil // the usual change: nothing to write, no socket to open
	}
	conn, done, err := Dial(s.NetNS)
	if err != nil {
		return err
	}
	defer done()
	return s.write(conn, todo, add)
}

// Repairs counts the rewrites of a table or set that someone changed after
// it was in place.
func (s *AddrSets) Repairs() uint64 { return s.repairs.Load() }

// Admit makes sure the table is in place (with full, or when what the
// sets hold is not known, checking it against the kernel and rewriting it
// in one transaction with its elements when it is not as wanted) and that
// the sets hold every address of want.
func (s *AddrSets) Admit(want map[netip.Addr]bool, full bool) error {
	if !full && s.have != nil && !s.missing(want) {
		return nil // the usual change: nothing to add, no socket to open
	}
	conn, done, err := Dial(s.NetNS)
	if err != nil {
		return err
	}
	defer done()
	if full || s.have == nil {
		ok, why, err := Check(conn, s.Spec)
		if err != nil {
			return err
		}
		if !ok {
			return s.rewrite(conn, maps.Clone(want), why)
		}
		kernel, err := s.read(conn)
		if err != nil {
			return err
		}
		if s.have != nil && !maps.Equal(kernel, s.have) {
			s.repairs.Add(1)
			s.Log.Warn("repaired the sets of "+s.What, "table", s.Spec.Name)
		}
		s.have, s.checked = kernel, true
	}
	var add []netip.Addr
	for a := range want {
		if !s.have[a] {
			add = append(add, a)
		}
	}
	return s.write(conn, add, true)
}

// missing reports whether want holds an address the sets do not.
func (s *AddrSets) missing(want map[netip.Addr]bool) bool {
	for a := range want {
		if !s.have[a] {
			return true
		}
	}
	return false
}

// Prune takes out the addresses that are not in want.
func (s *AddrSets) Prune(want map[netip.Addr]bool) error {
	var del []netip.Addr
	for a := range s.have {
		if !want[a] {
			del = append(del, a)
		}
	}
	if len(del) == 0 {
		return nil
	}
	conn, done, err := Dial(s.NetNS)
	if err != nil {
		return err
	}
	defer done()
	return s.write(conn, del, false)
}

// rewrite programs the whole table with want and what the sets still hold
// (Prune takes those out after the routes).
func (s *AddrSets) rewrite(conn *nftables.Conn, want map[netip.Addr]bool, why string) error {
	for a := range s.have {
		want[a] = true
	}
	spec := s.Spec
	spec.Sets = slices.Clone(spec.Sets)
	for a := range want {
		i := 0
		if a.Is6() {
			i = 1
		}
		spec.Sets[i].Elements = append(spec.Sets[i].Elements, a)
	}
	s.have = nil
	if err := Program(conn, spec); err != nil {
		return err
	}
	repair := s.checked
	s.have, s.checked = want, true
	if repair {
		s.repairs.Add(1)
		s.Log.Warn("repaired "+s.What, "table", s.Spec.Name, "reason", why)
	} else {
		s.Log.Info(s.What+" in place", "table", s.Spec.Name, "elements", len(want))
	}
	return nil
}

// write adds (or deletes) addrs in one transaction.
func (s *AddrSets) write(conn *nftables.Conn, addrs []netip.Addr, add bool) error {
	if len(addrs) == 0 {
		return nil
	}
	byFamily := [2][]netip.Addr{}
	for _, a := range addrs {
		i := 0
		if a.Is6() {
			i = 1
		}
		byFamily[i] = append(byFamily[i], a)
	}
	for i, as := range byFamily {
		if err := QueueElements(conn, &nftables.Set{Table: s.Spec.Ref(), Name: s.Spec.Sets[i].Name}, as, add); err != nil {
			return err
		}
	}
	if err := conn.Flush(); err != nil {
		s.have = nil // read it again
		return fmt.Errorf("update the sets of table %s: %w", s.Spec.Name, err)
	}
	for _, a := range addrs {
		if add {
			s.have[a] = true
		} else {
			delete(s.have, a)
		}
	}
	return nil
}

// read returns the addresses the sets hold.
func (s *AddrSets) read(conn *nftables.Conn) (map[netip.Addr]bool, error) {
	out := map[netip.Addr]bool{}
	for _, set := range s.Spec.Sets {
		els, err := conn.GetSetElements(&nftables.Set{Table: s.Spec.Ref(), Name: set.Name})
		if err != nil {
			return nil, fmt.Errorf("read set %s of table %s: %w", set.Name, s.Spec.Name, err)
		}
		for _, e := range els {
			if a, ok := netip.AddrFromSlice(e.Key); ok {
				out[a] = true
			}
		}
	}
	return out, nil
}

// Probe returns an error when nf_tables does not work in the namespace (a
// kernel without it): the caller then runs without the table and says so.
func (s *AddrSets) Probe() error {
	conn, done, err := Dial(s.NetNS)
	if err != nil {
		return err
	}
	defer done()
	_, err = conn.ListTablesOfFamily(s.Spec.Family)
	return err
}

// Missing reports whether err says that the kernel has no nf_tables (no
// nfnetlink, or no nf_tables subsystem in it).
func Missing(err error) bool {
	return errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EAFNOSUPPORT)
}
