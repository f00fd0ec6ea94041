package inspect

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

var (
	macA = subnet.MAC{0x02, 0, 0, 0, 0, 0xa}
	macB = subnet.MAC{0x02, 0, 0, 0, 0, 0xb}
	snA  = netip.MustParsePrefix("10.244.1.0/24")
	snB  = netip.MustParsePrefix("10.244.2.0/24")
	ipA  = netip.MustParseAddr("192.168.77.1")
	ipB  = netip.MustParseAddr("192.168.77.2")
)

// kernelWith is node 3's kernel holding peer B fully programmed, then
// changed by edit.
func kernelWith(kind string, edit func(k *Kernel)) *Kernel {
	k := &Kernel{
		Device:     Device{Name: "weft.1", Kind: kind, Addrs: []netip.Prefix{netip.MustParsePrefix("10.244.3.0/32")}},
		Neighbours: []Neighbour{{IP: snB.Addr(), MAC: macB, Permanent: true}},
		FDB:        []FDBEntry{{MAC: macB, Dst: ipB}},
		Routes:     []Route{{Dst: snB, Gw: snB.Addr(), OnLink: true, Proto: 87}},
	}
	if edit != nil {
		edit(k)
	}
	return k
}

func TestCompare(t *testing.T) {
	want := vtep.Table{snB: {MAC: macB, Addr: ipB}}
	tests := []struct {
		name   string
		kind   string
		edit   func(k *Kernel)
		want   vtep.Table
		verdic map[netip.Prefix]string
	}{
		{"programmed", KindVXLAN, nil, want, map[netip.Prefix]string{snB: OK}},
		{"missing route", KindVXLAN, func(k *Kernel) { k.Routes = nil }, want, map[netip.Prefix]string{snB: Missing}},
		{"stale peer", KindVXLAN, nil, vtep.Table{}, map[netip.Prefix]string{snB: Stale}},
		{"no neighbour", KindVXLAN, func(k *Kernel) { k.Neighbours = nil }, want, map[netip.Prefix]string{snB: NoNeighbour}},
		{"wrong mac", KindVXLAN, func(k *Kernel) { k.Neighbours[0].MAC = macA }, want, map[netip.Prefix]string{snB: WrongMAC}},
		{"no fdb", KindVXLAN, func(k *Kernel) { k.FDB = nil }, want, map[netip.Prefix]string{snB: NoFDB}},
		{"fdb elsewhere", KindVXLAN, func(k *Kernel) { k.FDB[0].Dst = ipA }, want, map[netip.Prefix]string{snB: WrongUnderlay}},
		{"tap needs no fdb", KindTAP, func(k *Kernel) { k.FDB = nil }, want, map[netip.Prefix]string{snB: OK}},
		{"wrong gateway", KindVXLAN, func(k *Kernel) { k.Routes[0].Gw = netip.MustParseAddr("10.244.2.9") }, want, map[netip.Prefix]string{snB: WrongGateway}},
		{"second peer missing", KindVXLAN, nil, vtep.Table{snA: {MAC: macA, Addr: ipA}, snB: {MAC: macB, Addr: ipB}},
			map[netip.Prefix]string{snA: Missing, snB: OK}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps := Compare(kernelWith(tt.kind, tt.edit), tt.want)
			if len(ps) != len(tt.verdic) {
				t.Fatalf("%d rows, want %d: %+v", len(ps), len(tt.verdic), ps)
			}
			bad := 0
			for _, p := range ps {
				if p.Verdict != tt.verdic[p.Subnet] {
					t.Errorf("%s: %q, want %q", p.Subnet, p.Verdict, tt.verdic[p.Subnet])
				}
				if p.Verdict != OK {
					bad++
				}
			}
			if Mismatches(ps) != bad {
				t.Errorf("Mismatches = %d, want %d", Mismatches(ps), bad)
			}
			var b strings.Builder
			if err := RenderPeers(&b, kernelWith(tt.kind, tt.edit), ps); err != nil || !strings.Contains(b.String(), "weft.1") {
				t.Errorf("render: %v\n%s", err, b.String())
			}
		})
	}
}

func TestSelfLease(t *testing.T) {
	own := subnet.Lease{Subnet: netip.MustParsePrefix("10.244.3.0/24"), Attrs: subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.77.3")}}
	other := subnet.Lease{Subnet: snB, Attrs: subnet.LeaseAttrs{PublicIP: ipB}}
	tests := []struct {
		name string
		k    *Kernel
		ok   bool
	}{
		{"by device address", kernelWith(KindTAP, nil), true},
		{"by vxlan local", &Kernel{Device: Device{Kind: KindVXLAN, Local: netip.MustParseAddr("192.168.77.3")}}, true},
		{"unknown", &Kernel{Device: Device{Kind: KindTAP}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, ok := SelfLease([]subnet.Lease{other, own}, tt.k)
			if ok != tt.ok || ok && l.Key() != own.Key() {
				t.Fatalf("SelfLease = %v, %v", l.Key(), ok)
			}
		})
	}
}

func TestRenderLeases(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ls := []Listed{
		{Lease: subnet.Lease{Subnet: snB, Expiration: now.Add(90 * time.Minute), Attrs: subnet.LeaseAttrs{PublicIP: ipB, BackendType: "vxlan", BackendData: &subnet.VXLANData{VNI: 1, VtepMAC: macB}}}, Granted: 24 * time.Hour},
		{Lease: subnet.Lease{Subnet: snA, Attrs: subnet.LeaseAttrs{PublicIP: ipA, BackendType: "vxlan"}}},
		{Lease: subnet.Lease{Subnet: netip.MustParsePrefix("10.244.9.0/24"), Expiration: now.Add(-time.Second)}, Granted: 24 * time.Hour},
		{Lease: subnet.Lease{Subnet: netip.MustParsePrefix("10.244.10.0/24"), Expiration: now.Add(30 * time.Minute)}, Granted: 24 * time.Hour},
	}
	var b strings.Builder
	if err := RenderLeases(&b, ls, time.Hour, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"1h30m0s", "no TTL", "expired", macB.String(), "192.168.77.2", "RENEWAL",
		"due in 30m0s", "OVERDUE 30m0s"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in\n%s", want, b.String())
		}
	}
	lines := strings.Split(b.String(), "\n")
	if !strings.HasSuffix(strings.TrimSpace(lines[2]), " -") {
		t.Errorf("a lease without TTL has a renewal, want \"-\":\n%s", b.String())
	}
	sorted := Leases(ls)
	SortLeases(sorted)
	if sorted[0].Subnet != snA {
		t.Fatalf("not sorted: %v", sorted[0].Subnet)
	}
}

// TestOverdue: a lease is overdue once its node's renewal (margin before
// expiry, or half the TTL when the margin is longer) is late by more than
// the grace.
func TestOverdue(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	lease := func(left, granted time.Duration) Listed {
		return Listed{Lease: subnet.Lease{Subnet: snA, Expiration: now.Add(left)}, Granted: granted}
	}
	for _, tt := range []struct {
		name    string
		l       Listed
		margin  time.Duration
		overdue bool
	}{
		{"just renewed", lease(24*time.Hour, 24*time.Hour), time.Hour, false},
		{"renewal due now", lease(time.Hour, 24*time.Hour), time.Hour, false},
		{"late within the minute of grace", lease(time.Hour-50*time.Second, 24*time.Hour), time.Hour, false},
		{"late past the grace", lease(time.Hour-70*time.Second, 24*time.Hour), time.Hour, true},
		{"a longer margin", lease(2*time.Hour, 24*time.Hour), 3 * time.Hour, true},
		{"short TTL, margin longer: due at half", lease(4*time.Second, 10*time.Second), time.Hour, false},
		{"short TTL, within the 3 s grace", lease(2500*time.Millisecond, 10*time.Second), time.Hour, false},
		{"short TTL, past half and the 3 s grace", lease(1500*time.Millisecond, 10*time.Second), time.Hour, true},
		{"reservation", Listed{Lease: subnet.Lease{Subnet: snA}}, time.Hour, false},
		{"Kubernetes lease", Listed{Lease: subnet.Lease{Subnet: snA, Expiration: now.Add(time.Second)}}, time.Hour, false},
	} {
		if _, got := Overdue(tt.l, tt.margin, now); got != tt.overdue {
			t.Errorf("%s: overdue %v, want %v", tt.name, got, tt.overdue)
		}
	}
}

func TestPathRender(t *testing.T) {
	p := &Path{Src: netip.MustParseAddr("10.244.1.2"), Dst: netip.MustParseAddr("10.244.77.2")}
	cfg := &subnet.Config{Network: netip.MustParsePrefix("10.244.0.0/16")}
	p.locate([]subnet.Lease{{Subnet: snA, Attrs: subnet.LeaseAttrs{PublicIP: ipA}}}, cfg)
	var b strings.Builder
	if err := p.Render(&b); err != nil {
		t.Fatal(err)
	}
	if len(p.Problems()) != 1 || !strings.Contains(b.String(), "!! no node owns") || !strings.Contains(b.String(), "1 problem(s)") {
		t.Fatalf("problems %v:\n%s", p.Problems(), b.String())
	}
	out := &Path{Src: netip.MustParseAddr("10.244.1.2"), Dst: netip.MustParseAddr("192.0.2.1")}
	out.locate([]subnet.Lease{{Subnet: snA, Attrs: subnet.LeaseAttrs{PublicIP: ipA}}}, cfg)
	if !out.Outside || len(out.Problems()) != 0 {
		t.Fatalf("a destination outside the network: outside %v, problems %v", out.Outside, out.Problems())
	}
}
