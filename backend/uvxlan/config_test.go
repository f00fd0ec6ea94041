package uvxlan

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

func TestNewConfig(t *testing.T) {
	v4 := netip.MustParseAddr("192.168.77.1")
	v6 := netip.MustParseAddr("fd77::1")
	sn := netip.MustParsePrefix("10.244.1.0/24")
	sn6 := netip.MustParsePrefix("fd00:10:244:1::/64")
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr string
		check   func(t *testing.T, c Config)
	}{
		{"defaults", Config{Local: v4, Subnet: sn}, "", func(t *testing.T, c Config) {
			if c.VNI != 1 || c.Port != 8472 || c.Name != "weft-u.1" || c.MTU != 1450 || c.PodMTU != 1450 || c.Queues != 1 || c.SourcePorts != 16 {
				t.Fatalf("defaults: %+v", c)
			}
			if c.MAC != vtep.DeviceMAC(v4, 1) {
				t.Fatalf("mac %s, want the derived one", c.MAC)
			}
		}},
		{"ipv6 defaults", Config{Local: v6, IPv6Subnet: sn6, VNI: 7}, "", func(t *testing.T, c Config) {
			if c.MTU != 1430 || c.Name != "weft-u.7" || c.MAC != vtep.DeviceMAC(v6, 7) {
				t.Fatalf("defaults: %+v", c)
			}
		}},
		{"mapped local", Config{Local: netip.AddrFrom16(v4.As16()), Subnet: sn}, "", func(t *testing.T, c Config) {
			if c.Local != v4 {
				t.Fatalf("local %s, want %s", c.Local, v4)
			}
		}},
		{"dual-stack pods", Config{Local: v4, Subnet: sn, PodMTU: 1430}, "", func(t *testing.T, c Config) {
			if c.MTU != 1450 || c.PodMTU != 1430 {
				t.Fatalf("mtu %d, pod mtu %d; want 1450 and 1430", c.MTU, c.PodMTU)
			}
		}},
		{"pod mtu above the device's", Config{Local: v4, Subnet: sn, MTU: 1400, PodMTU: 1450}, "", func(t *testing.T, c Config) {
			if c.PodMTU != 1400 {
				t.Fatalf("pod mtu %d, want the device's 1400", c.PodMTU)
			}
		}},
		{"small pod mtu", Config{Local: v4, PodMTU: 500}, "pod mtu", nil},
		{"no local", Config{Subnet: sn}, "no local", nil},
		{"vni too large", Config{Local: v4, VNI: 1 << 24}, "vni", nil},
		{"port too large", Config{Local: v4, Port: 70000}, "port", nil},
		{"long name", Config{Local: v4, Name: "weft-uvxlan-dev0"}, "longer than 15", nil},
		{"multicast mac", Config{Local: v4, MAC: subnet.MAC{1, 0, 0x5e, 0, 0, 1}}, "unicast", nil},
		{"small mtu", Config{Local: v4, MTU: 500}, "mtu", nil},
		{"ipv4 subnet over ipv6", Config{Local: v6, Subnet: sn}, "needs an IPv4", nil},
		{"ipv6 subnet over ipv4", Config{Local: v4, IPv6Subnet: sn6}, "needs an IPv6", nil},
		{"too many queues", Config{Local: v4, Queues: 17}, "queues", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(tc.cfg, nil)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, b.Config())
		})
	}
}
