package inspect

import (
	"net/netip"
	"testing"

	"github.com/weft-net/weft/vtep"
)

func TestCompareHostGW(t *testing.T) {
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	want := vtep.Table{
		p("10.244.2.0/24"): {Addr: a("192.168.77.2")}, // routed right
		p("10.244.3.0/24"): {Addr: a("192.168.77.3")}, // no route
		p("10.244.4.0/24"): {Addr: a("192.168.77.4")}, // routed elsewhere
		p("10.244.5.0/24"): {Addr: a("192.168.88.5")}, // another segment
	}
	routes := []Route{
		{Dst: p("10.244.2.0/24"), Gw: a("192.168.77.2"), Proto: 87},
		{Dst: p("10.244.4.0/24"), Gw: a("192.168.77.9"), Proto: 87},
		{Dst: p("10.244.9.0/24"), Gw: a("192.168.77.9"), Proto: 87}, // no lease
	}
	onLink := func(x netip.Addr) bool { return p("192.168.77.0/24").Contains(x) }
	got := CompareHostGW(routes, want, onLink)
	verdicts := map[string]string{
		"10.244.2.0/24": OK, "10.244.3.0/24": Missing, "10.244.4.0/24": WrongNextHop,
		"10.244.5.0/24": OffLink, "10.244.9.0/24": Stale,
	}
	if len(got) != len(verdicts) {
		t.Fatalf("%d rows, want %d: %+v", len(got), len(verdicts), got)
	}
	for _, r := range got {
		if r.Verdict != verdicts[r.Subnet.String()] {
			t.Errorf("%s: %q, want %q", r.Subnet, r.Verdict, verdicts[r.Subnet.String()])
		}
	}
	if n := HostGWMismatches(got); n != 4 {
		t.Errorf("mismatches %d, want 4", n)
	}
}
