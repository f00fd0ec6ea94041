// Package vtep holds the desired dataplane state as plain data: the table
// from each remote node subnet to the VTEP behind it, built from leases, and
// the pure difference between two tables that a backend applies.
package vtep

import (
	"iter"
	"net/netip"
	"slices"

	"github.com/weft-net/weft/subnet"
)

// Peer is a remote node as a dataplane sees it: its underlay address and,
// for VXLAN, its VTEP device MAC; for WireGuard, its public key and UDP port
// instead of a MAC; for extension, its lease's backend data. A table holds
// one per remote subnet, thousands on a large cluster: the fields are laid
// out to keep it small.
type Peer struct {
	MAC  subnet.MAC
	Port uint16 // wireguard: the peer's UDP port (0: the same as ours)
	Addr netip.Addr
	// Data is the wireguard peer's public key (base64), or the extension
	// lease's BackendData as JSON text ("" when none).
	Data string
}

// Table maps a remote node subnet (IPv4 or IPv6) to the peer behind it. A Table handed
// to a backend is never modified afterwards: build a new one for a change.
type Table map[netip.Prefix]Peer

// Entry is one row of a Table.
type Entry struct {
	Subnet netip.Prefix
	Peer   Peer
}

// FromLeases builds the table of every vxlan lease but self's. A lease
// contributes its IPv4 subnet when it has an IPv4 subnet, a public IPv4 and
// IPv4 backend data, and likewise for IPv6. Leases of other backends, and
// ones that lack the data, are left out: they cannot be reached over VXLAN.
func FromLeases(leases []subnet.Lease, self subnet.Lease) Table {
	return FromLeasesOf(subnet.BackendTypeVXLAN, leases, self)
}

// FromLeasesOf builds the table of every lease of the lease type typ (see
// subnet.LeaseType) but self's. For vxlan see FromLeases. For host-gw a
// lease contributes each subnet that has a public address of its family,
// with a zero MAC: the peer is reached by routing via that address. For extension a lease contributes one row, its IPv4
// subnet (its IPv6 subnet when it has none) with the public address of that
// family and its backend data, since the user's commands run once per lease.
// Other types (alloc) have no peers.
func FromLeasesOf(typ string, leases []subnet.Lease, self subnet.Lease) Table {
	return FromLeaseSeq(typ, len(leases), slices.Values(leases), self)
}

// FromLeaseSeq is FromLeasesOf on a sequence of n leases (the values of a
// map, without copying them into a slice first).
func FromLeaseSeq(typ string, n int, leases iter.Seq[subnet.Lease], self subnet.Lease) Table {
	switch typ {
	case subnet.BackendTypeVXLAN:
		return fromVXLAN(n, leases, self)
	case subnet.BackendTypeHostGW:
		return fromRouted(n, leases, self, subnet.BackendTypeHostGW)
	case subnet.BackendTypeExtension:
		return fromExtension(n, leases, self)
	case subnet.BackendTypeWireGuard:
		return fromWireGuard(n, leases, self)
	}
	return Table{}
}

// isSelf reports whether l has self's key without building the keys (a
// string per lease, for every table). Different subnets make different keys,
// except that a missing IPv4 subnet is written as 0.0.0.0/0 is: only then are
// the keys compared.
func isSelf(l, self subnet.Lease) bool {
	if l.IPv6Subnet != self.IPv6Subnet {
		return false
	}
	if l.Subnet == self.Subnet {
		return true
	}
	if !l.Subnet.IsValid() || !self.Subnet.IsValid() {
		return l.Key() == self.Key()
	}
	return false
}

// fromRouted: a lease of typ contributes each subnet (IPv4, and IPv6 when
// v6) that has a public address of its family.
func fromRouted(n int, leases iter.Seq[subnet.Lease], self subnet.Lease, typ string) Table {
	t := make(Table, n)
	for l := range leases {
		if isSelf(l, self) || l.Attrs.BackendType != typ {
			continue
		}
		if l.Subnet.IsValid() && l.Attrs.PublicIP.IsValid() {
			t[l.Subnet] = Peer{Addr: l.Attrs.PublicIP}
		}
		if l.IPv6Subnet.IsValid() && l.Attrs.PublicIPv6.IsValid() {
			t[l.IPv6Subnet] = Peer{Addr: l.Attrs.PublicIPv6}
		}
	}
	return t
}

func fromExtension(n int, leases iter.Seq[subnet.Lease], self subnet.Lease) Table {
	t := make(Table, n)
	for l := range leases {
		if isSelf(l, self) || l.Attrs.BackendType != subnet.BackendTypeExtension {
			continue
		}
		switch {
		case l.Subnet.IsValid():
			t[l.Subnet] = Peer{Addr: l.Attrs.PublicIP, Data: l.Attrs.ExtensionData}
		case l.IPv6Subnet.IsValid():
			t[l.IPv6Subnet] = Peer{Addr: l.Attrs.PublicIPv6, Data: l.Attrs.ExtensionData}
		}
	}
	return t
}

// fromWireGuard: a wireguard lease contributes each subnet of a family for
// which it has backend data with a public key; the address is the lease's
// public address of that family (invalid when it has none: a single-device
// mode may still reach the peer over the other family).
func fromWireGuard(n int, leases iter.Seq[subnet.Lease], self subnet.Lease) Table {
	t := make(Table, n)
	for l := range leases {
		if isSelf(l, self) || l.Attrs.BackendType != subnet.BackendTypeWireGuard {
			continue
		}
		if d := l.Attrs.WireGuard; d != nil && l.Subnet.IsValid() && d.PublicKey != "" {
			t[l.Subnet] = Peer{Addr: l.Attrs.PublicIP, Data: d.PublicKey, Port: d.Port}
		}
		if d := l.Attrs.WireGuardV6; d != nil && l.IPv6Subnet.IsValid() && d.PublicKey != "" {
			t[l.IPv6Subnet] = Peer{Addr: l.Attrs.PublicIPv6, Data: d.PublicKey, Port: d.Port}
		}
	}
	return t
}

func fromVXLAN(n int, leases iter.Seq[subnet.Lease], self subnet.Lease) Table {
	t := make(Table, n)
	for l := range leases {
		if isSelf(l, self) || l.Attrs.BackendType != subnet.BackendTypeVXLAN {
			continue
		}
		if d := l.Attrs.BackendData; d != nil && l.Subnet.IsValid() && l.Attrs.PublicIP.IsValid() && !d.VtepMAC.IsZero() {
			t[l.Subnet] = Peer{MAC: d.VtepMAC, Addr: l.Attrs.PublicIP}
		}
		if d := l.Attrs.BackendV6Data; d != nil && l.IPv6Subnet.IsValid() && l.Attrs.PublicIPv6.IsValid() && !d.VtepMAC.IsZero() {
			t[l.IPv6Subnet] = Peer{MAC: d.VtepMAC, Addr: l.Attrs.PublicIPv6}
		}
	}
	return t
}

// Entries returns the table's rows sorted by subnet, for stable output.
func (t Table) Entries() []Entry {
	out := make([]Entry, 0, len(t))
	for p, v := range t {
		out = append(out, Entry{Subnet: p, Peer: v})
	}
	slices.SortFunc(out, func(a, b Entry) int { return comparePrefix(a.Subnet, b.Subnet) })
	return out
}

// Update is a change to one row of a table: the subnet's new peer, or
// Gone when the table no longer has the subnet.
type Update struct {
	Subnet netip.Prefix
	Peer   Peer
	Gone   bool
}

// Change is a subnet whose VTEP changed (new MAC, new address, or both).
type Change struct {
	Subnet   netip.Prefix
	Old, New Peer
}

// Diff is what turns one table into another. Each slice is sorted by subnet.
type Diff struct {
	Add    []Entry
	Remove []Entry
	Change []Change
}

// Empty reports whether the diff has nothing to do.
func (d Diff) Empty() bool { return len(d.Add)+len(d.Remove)+len(d.Change) == 0 }

// Compute returns the diff from old to new. It is pure: neither table changes.
func Compute(old, new Table) Diff {
	var d Diff
	for p, nv := range new {
		ov, ok := old[p]
		switch {
		case !ok:
			d.Add = append(d.Add, Entry{Subnet: p, Peer: nv})
		case ov != nv:
			d.Change = append(d.Change, Change{Subnet: p, Old: ov, New: nv})
		}
	}
	for p, ov := range old {
		if _, ok := new[p]; !ok {
			d.Remove = append(d.Remove, Entry{Subnet: p, Peer: ov})
		}
	}
	d.sort()
	return d
}

// ComputeAt returns the diff from old to new when they can differ only at
// the subnets in at (which may hold subnets that did not change, and
// repeats): Compute's result, in time proportional to len(at) rather than
// to the tables' size. It is pure.
func ComputeAt(old, new Table, at []netip.Prefix) Diff {
	var d Diff
	seen := make(map[netip.Prefix]bool, len(at))
	for _, p := range at {
		if seen[p] {
			continue
		}
		seen[p] = true
		ov, inOld := old[p]
		nv, inNew := new[p]
		switch {
		case inNew && !inOld:
			d.Add = append(d.Add, Entry{Subnet: p, Peer: nv})
		case inOld && !inNew:
			d.Remove = append(d.Remove, Entry{Subnet: p, Peer: ov})
		case inOld && ov != nv:
			d.Change = append(d.Change, Change{Subnet: p, Old: ov, New: nv})
		}
	}
	d.sort()
	return d
}

func (d Diff) sort() {
	byEntry := func(a, b Entry) int { return comparePrefix(a.Subnet, b.Subnet) }
	slices.SortFunc(d.Add, byEntry)
	slices.SortFunc(d.Remove, byEntry)
	slices.SortFunc(d.Change, func(a, b Change) int { return comparePrefix(a.Subnet, b.Subnet) })
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}
