package daemon

import (
	"encoding/json"
	"net/netip"
	"testing"

	"github.com/weft-net/weft/subnet"
)

// TestLeaseValueAndMTUPerBackend checks the lease value each backend
// advertises, written as flanneld writes it, and the pod MTU.
func TestLeaseValueAndMTUPerBackend(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16"}`))
	if err != nil {
		t.Fatal(err)
	}
	d := &Daemon{cfg: Config{Node: Node{PublicIP: netip.MustParseAddr("192.168.77.1"), UnderlayMTU: 1500}}}
	tests := []struct {
		typ  string
		json string
		mtu  int
	}{
		{subnet.BackendTypeHostGW, `{"PublicIP":"192.168.77.1","PublicIPv6":null,"BackendType":"host-gw"}`, 1500},
		{subnet.BackendTypeAlloc, `{"PublicIP":"192.168.77.1","PublicIPv6":null}`, 1500},
		{subnet.BackendTypeWireGuard, `{"PublicIP":"192.168.77.1","PublicIPv6":null,"BackendType":"wireguard"}`, 1420},
		{subnet.BackendTypeVXLAN, "", 1450},
	}
	for _, tc := range tests {
		t.Run(tc.typ, func(t *testing.T) {
			b, err := json.Marshal(d.attrs(cfg, tc.typ))
			if err != nil {
				t.Fatal(err)
			}
			if tc.json != "" && string(b) != tc.json {
				t.Errorf("lease value %s, want %s", b, tc.json)
			}
			if mtu := d.overlayMTU(cfg, tc.typ); mtu != tc.mtu {
				t.Errorf("MTU %d, want %d", mtu, tc.mtu)
			}
		})
	}
}
