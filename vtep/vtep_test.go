package vtep

import (
	"maps"
	"net/netip"
	"reflect"
	"testing"

	"github.com/weft-net/weft/subnet"
)

var (
	macA = subnet.MAC{0x02, 0, 0, 0, 0, 0xa}
	macB = subnet.MAC{0x02, 0, 0, 0, 0, 0xb}
	macC = subnet.MAC{0x02, 0, 0, 0, 0, 0xc}
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func ip(s string) netip.Addr    { return netip.MustParseAddr(s) }

func lease(v4, v6, pub, pub6 string, mac, mac6 subnet.MAC) subnet.Lease {
	l := subnet.Lease{Attrs: subnet.LeaseAttrs{BackendType: "vxlan"}}
	if v4 != "" {
		l.Subnet = pfx(v4)
		l.Attrs.PublicIP = ip(pub)
		l.Attrs.BackendData = &subnet.VXLANData{VNI: 1, VtepMAC: mac}
	}
	if v6 != "" {
		l.IPv6Subnet = pfx(v6)
		l.Attrs.PublicIPv6 = ip(pub6)
		l.Attrs.BackendV6Data = &subnet.VXLANData{VNI: 1, VtepMAC: mac6}
	}
	return l
}

func TestFromLeases(t *testing.T) {
	self := lease("10.244.1.0/24", "", "192.168.77.1", "", macA, subnet.MAC{})
	hostGW := lease("10.244.9.0/24", "", "192.168.77.9", "", macC, subnet.MAC{})
	hostGW.Attrs.BackendType = "host-gw"
	noData := lease("10.244.8.0/24", "", "192.168.77.8", "", macC, subnet.MAC{})
	noData.Attrs.BackendData = nil
	zeroMAC := lease("10.244.7.0/24", "", "192.168.77.7", "", subnet.MAC{}, subnet.MAC{})
	tests := []struct {
		name   string
		leases []subnet.Lease
		want   Table
	}{
		{"empty", nil, Table{}},
		{"self is left out", []subnet.Lease{self}, Table{}},
		{"one peer", []subnet.Lease{self, lease("10.244.2.0/24", "", "192.168.77.2", "", macB, subnet.MAC{})},
			Table{pfx("10.244.2.0/24"): {MAC: macB, Addr: ip("192.168.77.2")}}},
		{"dual-stack peer gives two rows", []subnet.Lease{lease("10.244.2.0/24", "fd00:10:244:2::/64", "192.168.77.2", "fd77::2", macB, macC)},
			Table{pfx("10.244.2.0/24"): {MAC: macB, Addr: ip("192.168.77.2")}, pfx("fd00:10:244:2::/64"): {MAC: macC, Addr: ip("fd77::2")}}},
		{"IPv6-only peer", []subnet.Lease{lease("", "fd00:10:244:2::/64", "", "fd77::2", subnet.MAC{}, macC)},
			Table{pfx("fd00:10:244:2::/64"): {MAC: macC, Addr: ip("fd77::2")}}},
		{"other backends, missing data and zero MACs are left out", []subnet.Lease{hostGW, noData, zeroMAC}, Table{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := FromLeases(tt.leases, self); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestCompute(t *testing.T) {
	a := Peer{MAC: macA, Addr: ip("192.168.77.1")}
	b := Peer{MAC: macB, Addr: ip("192.168.77.2")}
	bMoved := Peer{MAC: macB, Addr: ip("192.168.77.22")}
	p1, p2, p3 := pfx("10.244.1.0/24"), pfx("10.244.2.0/24"), pfx("10.244.3.0/24")
	tests := []struct {
		name     string
		old, new Table
		want     Diff
	}{
		{"both empty", Table{}, Table{}, Diff{}},
		{"nil old", nil, Table{p1: a}, Diff{Add: []Entry{{p1, a}}}},
		{"unchanged", Table{p1: a, p2: b}, Table{p1: a, p2: b}, Diff{}},
		{"add sorted", Table{}, Table{p3: a, p1: b}, Diff{Add: []Entry{{p1, b}, {p3, a}}}},
		{"remove", Table{p1: a, p2: b}, Table{p1: a}, Diff{Remove: []Entry{{p2, b}}}},
		{"address change", Table{p2: b}, Table{p2: bMoved}, Diff{Change: []Change{{p2, b, bMoved}}}},
		{"mac change", Table{p2: b}, Table{p2: Peer{MAC: macC, Addr: b.Addr}}, Diff{Change: []Change{{p2, b, Peer{MAC: macC, Addr: b.Addr}}}}},
		{"all at once", Table{p1: a, p2: b}, Table{p2: bMoved, p3: a},
			Diff{Add: []Entry{{p3, a}}, Remove: []Entry{{p1, a}}, Change: []Change{{p2, b, bMoved}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			oldCopy, newCopy := maps.Clone(tt.old), maps.Clone(tt.new)
			got := Compute(tt.old, tt.new)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			if got.Empty() != (len(tt.want.Add)+len(tt.want.Remove)+len(tt.want.Change) == 0) {
				t.Fatal("Empty disagrees with the diff")
			}
			if !maps.Equal(oldCopy, tt.old) || !maps.Equal(newCopy, tt.new) {
				t.Fatal("Compute modified a table")
			}
			// ComputeAt, told every subnet of both tables (twice, and one
			// in neither), finds the same diff.
			at := []netip.Prefix{pfx("10.244.9.0/24")}
			for p := range tt.old {
				at = append(at, p, p)
			}
			for p := range tt.new {
				at = append(at, p)
			}
			if got := ComputeAt(tt.old, tt.new, at); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ComputeAt: got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestEntriesSorted(t *testing.T) {
	tb := Table{pfx("10.244.3.0/24"): {}, pfx("fd00::/64"): {}, pfx("10.244.1.0/24"): {}}
	got := tb.Entries()
	want := []netip.Prefix{pfx("10.244.1.0/24"), pfx("10.244.3.0/24"), pfx("fd00::/64")}
	for i, e := range got {
		if e.Subnet != want[i] {
			t.Fatalf("entry %d: %s, want %s", i, e.Subnet, want[i])
		}
	}
}

func TestFromLeasesOfHostGW(t *testing.T) {
	hg := func(v4, v6, pub, pub6 string) subnet.Lease {
		l := lease(v4, v6, pub, pub6, subnet.MAC{}, subnet.MAC{})
		l.Attrs = subnet.LeaseAttrs{BackendType: "host-gw", PublicIP: l.Attrs.PublicIP, PublicIPv6: l.Attrs.PublicIPv6}
		return l
	}
	self := hg("10.244.1.0/24", "", "192.168.77.1", "")
	vx := lease("10.244.5.0/24", "", "192.168.77.5", "", macA, subnet.MAC{})
	noIP := hg("10.244.6.0/24", "", "192.168.77.6", "")
	noIP.Attrs.PublicIP = netip.Addr{}
	leases := []subnet.Lease{self, vx, noIP,
		hg("10.244.2.0/24", "fd00:10:244:2::/64", "192.168.77.2", "fd77::2"),
		hg("", "fd00:10:244:3::/64", "", "fd77::3")}
	want := Table{
		pfx("10.244.2.0/24"):      {Addr: ip("192.168.77.2")},
		pfx("fd00:10:244:2::/64"): {Addr: ip("fd77::2")},
		pfx("fd00:10:244:3::/64"): {Addr: ip("fd77::3")},
	}
	if got := FromLeasesOf(subnet.BackendTypeHostGW, leases, self); !reflect.DeepEqual(got, want) {
		t.Errorf("host-gw: got %v, want %v", got, want)
	}
	if got := FromLeasesOf(subnet.BackendTypeVXLAN, leases, self); !reflect.DeepEqual(got, Table{pfx("10.244.5.0/24"): {MAC: macA, Addr: ip("192.168.77.5")}}) {
		t.Errorf("vxlan: got %v", got)
	}
	if got := FromLeasesOf("", leases, self); len(got) != 0 {
		t.Errorf("alloc: got %v, want no peers", got)
	}
}

// TestFromLeasesOfExtension: an extension lease gives one row with its
// data; leases of other types give none.
func TestFromLeasesOfExtension(t *testing.T) {
	typed := func(typ, v4, v6, pub, pub6, data string) subnet.Lease {
		l := lease(v4, v6, pub, pub6, subnet.MAC{}, subnet.MAC{})
		l.Attrs = subnet.LeaseAttrs{BackendType: typ, PublicIP: l.Attrs.PublicIP, PublicIPv6: l.Attrs.PublicIPv6, ExtensionData: data}
		return l
	}
	leases := []subnet.Lease{
		typed("ipip", "10.244.1.0/24", "", "192.168.77.1", "", ""), // self
		typed("ipip", "10.244.2.0/24", "", "192.168.77.2", "", ""),
		typed("ipip", "10.244.3.0/24", "fd00:10:244:3::/64", "192.168.77.3", "fd77::3", ""),
		typed("host-gw", "10.244.4.0/24", "", "192.168.77.4", "", ""),
		typed("extension", "10.244.5.0/24", "fd00:10:244:5::/64", "192.168.77.5", "fd77::5", `"aa"`),
		typed("extension", "", "fd00:10:244:6::/64", "", "fd77::6", ""),
	}
	self := leases[0]
	wantExt := Table{
		pfx("10.244.5.0/24"):      {Addr: ip("192.168.77.5"), Data: `"aa"`},
		pfx("fd00:10:244:6::/64"): {Addr: ip("fd77::6")},
	}
	if got := FromLeasesOf(subnet.BackendTypeExtension, leases, self); !reflect.DeepEqual(got, wantExt) {
		t.Errorf("extension: got %v, want %v", got, wantExt)
	}
}

// TestIsSelfMatchesKeys: isSelf says exactly what comparing the keys says.
func TestIsSelfMatchesKeys(t *testing.T) {
	pfx := []netip.Prefix{{}, netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("10.244.1.0/24"),
		netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("10.244.1.0/25"), netip.MustParsePrefix("::ffff:10.244.1.0/120")}
	pfx6 := []netip.Prefix{{}, netip.MustParsePrefix("::/0"), netip.MustParsePrefix("fd00:1::/64"), netip.MustParsePrefix("fd00:2::/64")}
	var ls []subnet.Lease
	for _, v4 := range pfx {
		for _, v6 := range pfx6 {
			ls = append(ls, subnet.Lease{Subnet: v4, IPv6Subnet: v6})
		}
	}
	for _, a := range ls {
		for _, b := range ls {
			if got, want := isSelf(a, b), a.Key() == b.Key(); got != want {
				t.Errorf("isSelf(%s, %s) = %v, keys say %v", a.Key(), b.Key(), got, want)
			}
		}
	}
}
