package backend

import (
	"net/netip"
	"testing"
)

func TestVTEPMAC(t *testing.T) {
	a := VTEPMAC(netip.MustParseAddr("192.168.77.1"), 1)
	if a != VTEPMAC(netip.MustParseAddr("192.168.77.1"), 1) {
		t.Fatal("not stable")
	}
	if a[0]&0x01 != 0 || a[0]&0x02 == 0 {
		t.Fatalf("%s: want a unicast, locally administered address", a)
	}
	seen := map[string]bool{a.String(): true}
	for _, other := range []struct {
		ip  string
		vni int
	}{{"192.168.77.2", 1}, {"192.168.77.1", 2}, {"fd77::1", 1}} {
		m := VTEPMAC(netip.MustParseAddr(other.ip), other.vni)
		if seen[m.String()] {
			t.Fatalf("%s vni %d: MAC %s collides", other.ip, other.vni, m)
		}
		seen[m.String()] = true
	}
}

func TestOverlayMTU(t *testing.T) {
	if got := OverlayMTU(1500, false); got != 1450 {
		t.Fatalf("IPv4 underlay: %d, want 1450", got)
	}
	if got := OverlayMTU(1500, true); got != 1430 {
		t.Fatalf("IPv6 underlay: %d, want 1430", got)
	}
}
