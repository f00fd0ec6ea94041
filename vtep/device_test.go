package vtep

import (
	"net/netip"
	"testing"
)

// TestDeviceMACGolden pins DeviceMAC's values. They must survive upgrades: a
// node's VTEP MAC is written in its lease and programmed in every peer's
// neighbour and FDB entries, so a change would break traffic between
// upgraded and not yet upgraded nodes. The values were computed once outside
// weft (sha256 of "weft-vtep\x00", the 16-byte address and the 3-byte VNI;
// first 6 bytes, unicast and locally administered bits set). Never update
// them to make the test pass.
func TestDeviceMACGolden(t *testing.T) {
	for _, tt := range []struct {
		ip   string
		vni  int
		want string
	}{
		{"192.168.77.1", 1, "52:b5:02:60:39:4f"},
		{"192.168.77.2", 1, "22:a3:18:45:18:ec"},
		{"192.168.77.1", 2, "0a:5b:88:ed:d8:e5"},
		{"10.0.0.1", 1, "ae:4b:fd:0b:c5:b3"},
		{"fd77::1", 1, "8e:a8:a6:1c:52:51"},
	} {
		if got := DeviceMAC(netip.MustParseAddr(tt.ip), tt.vni).String(); got != tt.want {
			t.Errorf("DeviceMAC(%s, %d) = %s, want %s: a changed VTEP MAC breaks mixed-version clusters", tt.ip, tt.vni, got, tt.want)
		}
	}
}

func TestDeviceMAC(t *testing.T) {
	a := DeviceMAC(netip.MustParseAddr("192.168.77.1"), 1)
	if a != DeviceMAC(netip.MustParseAddr("192.168.77.1"), 1) {
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
		m := DeviceMAC(netip.MustParseAddr(other.ip), other.vni)
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
