package daemon

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

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
		{subnet.BackendTypeExtension, `{"PublicIP":"192.168.77.1","PublicIPv6":null,"BackendType":"extension"}`, 1500},
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

// TestPodMTU: a dual-stack node of vxlan or uvxlan gives pods its IPv6
// device's MTU (the overlay MTU minus 20); every other node the overlay MTU.
func TestPodMTU(t *testing.T) {
	d := &Daemon{cfg: Config{Node: Node{PublicIP: netip.MustParseAddr("192.168.77.1"), UnderlayMTU: 1500}}}
	v4 := subnet.Lease{Subnet: netip.MustParsePrefix("10.244.1.0/24")}
	dual := subnet.Lease{Subnet: v4.Subnet, IPv6Subnet: netip.MustParsePrefix("fd00:10:244:1::/64")}
	for _, tc := range []struct {
		typ   string
		lease subnet.Lease
		mtu   int
	}{
		{subnet.BackendTypeVXLAN, v4, 1450}, {subnet.BackendTypeVXLAN, dual, 1430},
		{subnet.BackendTypeUVXLAN, v4, 1450}, {subnet.BackendTypeUVXLAN, dual, 1430},
		{subnet.BackendTypeWireGuard, dual, 1450}, {subnet.BackendTypeHostGW, dual, 1450},
	} {
		if got := d.podMTU(tc.typ, tc.lease, 1450); got != tc.mtu {
			t.Errorf("%s, IPv6 subnet %v: pod MTU %d, want %d", tc.typ, tc.lease.IPv6Subnet, got, tc.mtu)
		}
	}
}

// TestDaemonRefusesOtherBackends: a node told to run Flannel's udp or
// ipsec backend, or a type nobody knows, does not start, and the error says
// what to use instead; no dataplane is built.
func TestDaemonRefusesOtherBackends(t *testing.T) {
	for typ, want := range map[string]string{
		"udp":   `backend "udp": Flannel's udp backend is not supported; use "uvxlan", weft's userspace VXLAN`,
		"ipsec": `backend "ipsec": Flannel's ipsec backend is not supported; use "wireguard"`,
		"ipip":  `backend "ipip": Flannel's ipip backend is not supported yet; use "vxlan"`,
		"gre":   `backend "gre": unknown, weft runs "vxlan", "uvxlan", "host-gw", "wireguard", "extension" or "alloc"`,
	} {
		t.Run(typ, func(t *testing.T) {
			d, err := New(Config{
				Registry:    &fakeRegistry{cfg: testConfig(t)},
				Node:        Node{PublicIP: netip.MustParseAddr("192.168.77.1")},
				BackendType: typ,
				Factories: Factories{Dataplane: func(string, *subnet.Config, subnet.Lease, int) (Dataplane, error) {
					t.Error("dataplane built")
					return Dataplane{}, nil
				}},
			}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := d.Run(ctx); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Run: %v\nwant an error saying %s", err, want)
			}
		})
	}
}
