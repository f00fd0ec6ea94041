package subnet

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func mustMAC(t *testing.T, s string) MAC {
	t.Helper()
	m, err := ParseMAC(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestLeaseAttrsJSON(t *testing.T) {
	mac := mustMAC(t, "4e:fb:7d:bf:6b:2d")
	mac6 := mustMAC(t, "c6:1f:8a:3b:00:01")
	tests := []struct {
		name  string
		attrs LeaseAttrs
		json  string // exactly as flanneld writes it
	}{
		{
			name: "flanneld vxlan IPv4",
			attrs: LeaseAttrs{PublicIP: mustAddr(t, "192.168.77.1"), BackendType: "vxlan",
				BackendData: &VXLANData{VNI: 1, VtepMAC: mac}},
			json: `{"PublicIP":"192.168.77.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:2d"}}`,
		},
		{
			name: "dual-stack",
			attrs: LeaseAttrs{PublicIP: mustAddr(t, "192.168.77.1"), PublicIPv6: mustAddr(t, "fd77::1"), BackendType: "vxlan",
				BackendData: &VXLANData{VNI: 1, VtepMAC: mac}, BackendV6Data: &VXLANData{VNI: 1, VtepMAC: mac6}},
			json: `{"PublicIP":"192.168.77.1","PublicIPv6":"fd77::1","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:2d"},"BackendV6Data":{"VNI":1,"VtepMAC":"c6:1f:8a:3b:00:01"}}`,
		},
		{
			name: "IPv6-only writes PublicIP 0.0.0.0",
			attrs: LeaseAttrs{PublicIPv6: mustAddr(t, "fd77::1"), BackendType: "vxlan",
				BackendV6Data: &VXLANData{VNI: 3, VtepMAC: mac6}},
			json: `{"PublicIP":"0.0.0.0","PublicIPv6":"fd77::1","BackendType":"vxlan","BackendV6Data":{"VNI":3,"VtepMAC":"c6:1f:8a:3b:00:01"}}`,
		},
		{
			name:  "host-gw, as flanneld writes it",
			attrs: LeaseAttrs{PublicIP: mustAddr(t, "192.168.77.1"), BackendType: "host-gw"},
			json:  `{"PublicIP":"192.168.77.1","PublicIPv6":null,"BackendType":"host-gw"}`,
		},
		{
			name:  "host-gw dual-stack",
			attrs: LeaseAttrs{PublicIP: mustAddr(t, "192.168.77.1"), PublicIPv6: mustAddr(t, "fd77::1"), BackendType: "host-gw"},
			json:  `{"PublicIP":"192.168.77.1","PublicIPv6":"fd77::1","BackendType":"host-gw"}`,
		},
		{
			name: "wireguard dual-stack, as flanneld writes it",
			attrs: LeaseAttrs{PublicIP: mustAddr(t, "192.168.77.1"), PublicIPv6: mustAddr(t, "fd77::1"), BackendType: "wireguard",
				WireGuard:   &WireGuardData{PublicKey: "Jd1Dnz8qQ3BvjmFh1lONkVbSpRd4q3gdTjgN8UqFKUY=", Port: 51820},
				WireGuardV6: &WireGuardData{PublicKey: "Jd1Dnz8qQ3BvjmFh1lONkVbSpRd4q3gdTjgN8UqFKUY=", Port: 51821}},
			json: `{"PublicIP":"192.168.77.1","PublicIPv6":"fd77::1","BackendType":"wireguard","BackendData":{"PublicKey":"Jd1Dnz8qQ3BvjmFh1lONkVbSpRd4q3gdTjgN8UqFKUY=","Port":51820},"BackendV6Data":{"PublicKey":"Jd1Dnz8qQ3BvjmFh1lONkVbSpRd4q3gdTjgN8UqFKUY=","Port":51821}}`,
		},
		{
			name:  "ipip, as flanneld writes it (no backend data)",
			attrs: LeaseAttrs{PublicIP: mustAddr(t, "192.168.77.3"), BackendType: "ipip"},
			json:  `{"PublicIP":"192.168.77.3","PublicIPv6":null,"BackendType":"ipip"}`,
		},
		{
			name: "extension, as flanneld writes it (the PreStartupCommand's output as a JSON string)",
			attrs: LeaseAttrs{PublicIP: mustAddr(t, "192.168.77.4"), BackendType: "extension",
				ExtensionData: `"4e:fb:7d:bf:6b:2d"`},
			json: `{"PublicIP":"192.168.77.4","PublicIPv6":null,"BackendType":"extension","BackendData":"4e:fb:7d:bf:6b:2d"}`,
		},
		{
			name:  "extension without PreStartupCommand, as flanneld writes it",
			attrs: LeaseAttrs{PublicIP: mustAddr(t, "192.168.77.4"), BackendType: "extension"},
			json:  `{"PublicIP":"192.168.77.4","PublicIPv6":null,"BackendType":"extension"}`,
		},
		{
			name:  "no backend fields, as flanneld omits them (alloc)",
			attrs: LeaseAttrs{PublicIP: mustAddr(t, "10.0.0.1")},
			json:  `{"PublicIP":"10.0.0.1","PublicIPv6":null}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := json.Marshal(tt.attrs)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.json {
				t.Errorf("Marshal:\n got %s\nwant %s", got, tt.json)
			}
			var back LeaseAttrs
			if err := json.Unmarshal([]byte(tt.json), &back); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back, tt.attrs) {
				t.Errorf("Unmarshal:\n got %+v\nwant %+v", back, tt.attrs)
			}
		})
	}
}

// TestLeaseAttrsRoundTrip: whatever weft writes for a vxlan, host-gw or
// alloc lease reads back as it was.
func TestLeaseAttrsRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		var a LeaseAttrs
		a.BackendType = []string{BackendTypeVXLAN, BackendTypeHostGW, "alloc"}[i%3]
		if r.IntN(4) > 0 {
			a.PublicIP = netip.AddrFrom4([4]byte{byte(1 + r.IntN(254)), byte(r.IntN(256)), byte(r.IntN(256)), byte(1 + r.IntN(254))})
		}
		if r.IntN(2) == 0 {
			var b [16]byte
			b[0] = 0xfd
			for j := 1; j < 16; j++ {
				b[j] = byte(r.IntN(256))
			}
			a.PublicIPv6 = netip.AddrFrom16(b)
		}
		data := func() *VXLANData {
			var m MAC
			for j := range m {
				m[j] = byte(r.IntN(256))
			}
			return &VXLANData{VNI: r.IntN(1 << 24), VtepMAC: m}
		}
		if a.BackendType == BackendTypeVXLAN && a.PublicIP.IsValid() {
			a.BackendData = data()
		}
		if a.BackendType == BackendTypeVXLAN && a.PublicIPv6.IsValid() {
			a.BackendV6Data = data()
		}
		b, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		var back LeaseAttrs
		if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, a) {
			t.Fatalf("Unmarshal(%s) = %+v, %v; want %+v", b, back, err, a)
		}
	}
}

func TestLeaseAttrsUnmarshalOtherBackends(t *testing.T) {
	tests := []struct {
		name string
		json string
		want LeaseAttrs
	}{
		{"host-gw", `{"PublicIP":"10.0.0.2","PublicIPv6":null,"BackendType":"host-gw"}`,
			LeaseAttrs{PublicIP: mustAddr(t, "10.0.0.2"), BackendType: "host-gw"}},
		{"udp data dropped", `{"PublicIP":"10.0.0.3","BackendType":"udp","BackendData":{"SubnetTEP":"x"}}`,
			LeaseAttrs{PublicIP: mustAddr(t, "10.0.0.3"), BackendType: "udp"}},
		{"vxlan with null data", `{"PublicIP":"10.0.0.4","PublicIPv6":null,"BackendType":"vxlan","BackendData":null}`,
			LeaseAttrs{PublicIP: mustAddr(t, "10.0.0.4"), BackendType: "vxlan"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got LeaseAttrs
			if err := json.Unmarshal([]byte(tt.json), &got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestLeaseAttrsErrors(t *testing.T) {
	bad := []struct{ name, json string }{
		{"not JSON", `{"PublicIP":`},
		{"PublicIP not an address", `{"PublicIP":"nope"}`},
		{"PublicIP is IPv6", `{"PublicIP":"fd00::1"}`},
		{"PublicIPv6 is IPv4", `{"PublicIP":"10.0.0.1","PublicIPv6":"10.0.0.2"}`},
		{"PublicIPv6 is IPv4-mapped", `{"PublicIP":"10.0.0.1","PublicIPv6":"::ffff:10.0.0.2"}`},
		{"trailing value", `{"PublicIP":"10.0.0.1","PublicIPv6":null}{}`},
		{"VNI not a whole number", `{"PublicIP":"10.0.0.1","BackendType":"vxlan","BackendData":{"VNI":1.5,"VtepMAC":"4e:fb:7d:bf:6b:2d"}}`},
		{"bad VtepMAC", `{"PublicIP":"10.0.0.1","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"zz"}}`},
		{"bad BackendV6Data", `{"PublicIP":"10.0.0.1","BackendType":"vxlan","BackendV6Data":[1]}`},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			var a LeaseAttrs
			if err := json.Unmarshal([]byte(tt.json), &a); err == nil {
				t.Errorf("Unmarshal(%s) succeeded: %+v", tt.json, a)
			}
		})
	}
	badMarshal := []struct {
		name  string
		attrs LeaseAttrs
		want  string
	}{
		{"IPv6 in PublicIP", LeaseAttrs{PublicIP: mustAddr(t, "fd00::1")}, "PublicIP fd00::1: not an IPv4 address"},
		{"IPv4 in PublicIPv6", LeaseAttrs{PublicIPv6: mustAddr(t, "10.0.0.1")}, "PublicIPv6 10.0.0.1: not an IPv6 address"},
	}
	for _, tt := range badMarshal {
		t.Run(tt.name, func(t *testing.T) {
			_, err := json.Marshal(tt.attrs)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Marshal error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestKeyCodec(t *testing.T) {
	tests := []struct {
		name   string
		v4, v6 string
		key    string
	}{
		{"IPv4", "10.244.59.0/24", "", "10.244.59.0-24"},
		{"dual-stack", "10.244.92.0/24", "fd00:10:244:50::/64", "10.244.92.0-24&fd00:10:244:50::-64"},
		{"IPv6-only", "", "fd00:10:244:50::/64", "0.0.0.0-0&fd00:10:244:50::-64"},
		{"small IPv4", "10.1.4.4/30", "", "10.1.4.4-30"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var v4, v6 netip.Prefix
			if tt.v4 != "" {
				v4 = mustPrefix(t, tt.v4)
			}
			if tt.v6 != "" {
				v6 = mustPrefix(t, tt.v6)
			}
			if got := MakeKey(v4, v6); got != tt.key {
				t.Errorf("MakeKey = %q, want %q", got, tt.key)
			}
			if got := (Lease{Subnet: v4, IPv6Subnet: v6}).Key(); got != tt.key {
				t.Errorf("Lease.Key = %q, want %q", got, tt.key)
			}
			g4, g6, err := ParseKey(tt.key)
			if err != nil {
				t.Fatal(err)
			}
			if g4 != v4 || g6 != v6 {
				t.Errorf("ParseKey = %v, %v, want %v, %v", g4, g6, v4, v6)
			}
		})
	}
}

func TestParseKeyErrors(t *testing.T) {
	for _, key := range []string{
		"",
		"foo",
		"10.244.1.0/24",
		"10.244.1.0-33",
		"10.244.1.5-24",
		"10.244.1.0-x",
		"fd00::-64",
		"0.0.0.0-0",
		"10.244.1.0-24&",
		"10.244.1.0-24&10.0.0.0-24",
		"10.244.1.0-24&fd00::1-64",
		"10.244.1.0-24&fe80::%eth0-64",
		"::ffff:10.244.1.0-120",
	} {
		t.Run(key, func(t *testing.T) {
			v4, v6, err := ParseKey(key)
			if !errors.Is(err, ErrBadKey) {
				t.Errorf("ParseKey(%q) = %v, %v, %v; want ErrBadKey", key, v4, v6, err)
			}
		})
	}
}

func TestMAC(t *testing.T) {
	m := mustMAC(t, "4E-FB-7D-BF-6B-2D")
	if m.String() != "4e:fb:7d:bf:6b:2d" || m.IsZero() {
		t.Errorf("ParseMAC = %s", m)
	}
	if !(MAC{}).IsZero() {
		t.Error("zero MAC not IsZero")
	}
	for _, s := range []string{"", "4e:fb:7d", "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01"} {
		if _, err := ParseMAC(s); err == nil {
			t.Errorf("ParseMAC(%q) succeeded", s)
		}
	}
}

// TestLeaseAttrsEqual: every field counts, backend data by value.
func TestLeaseAttrsEqual(t *testing.T) {
	base := func() LeaseAttrs {
		return LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.1.1"), PublicIPv6: netip.MustParseAddr("fd00::1"),
			BackendType: "vxlan", BackendData: &VXLANData{VNI: 1, VtepMAC: MAC{2, 0, 0, 0, 0, 1}},
			BackendV6Data: &VXLANData{VNI: 1, VtepMAC: MAC{2, 0, 0, 0, 0, 2}},
			WireGuard:     &WireGuardData{PublicKey: "k", Port: 51820}, WireGuardV6: &WireGuardData{PublicKey: "k6", Port: 51821}}
	}
	if a, b := base(), base(); !a.Equal(b) {
		t.Fatal("equal attrs with distinct pointers are not Equal")
	}
	for name, change := range map[string]func(*LeaseAttrs){
		"PublicIP":           func(a *LeaseAttrs) { a.PublicIP = netip.MustParseAddr("192.168.1.2") },
		"PublicIPv6":         func(a *LeaseAttrs) { a.PublicIPv6 = netip.Addr{} },
		"BackendType":        func(a *LeaseAttrs) { a.BackendType = "host-gw" },
		"BackendData VNI":    func(a *LeaseAttrs) { a.BackendData.VNI = 2 },
		"BackendData MAC":    func(a *LeaseAttrs) { a.BackendData.VtepMAC[5] = 9 },
		"BackendData nil":    func(a *LeaseAttrs) { a.BackendData = nil },
		"BackendV6Data":      func(a *LeaseAttrs) { a.BackendV6Data.VtepMAC[0] = 6 },
		"WireGuard key":      func(a *LeaseAttrs) { a.WireGuard.PublicKey = "other" },
		"WireGuard port":     func(a *LeaseAttrs) { a.WireGuard.Port = 1 },
		"WireGuardV6 absent": func(a *LeaseAttrs) { a.WireGuardV6 = nil },
	} {
		a, b := base(), base()
		change(&b)
		if a.Equal(b) || b.Equal(a) {
			t.Errorf("%s changed, still Equal", name)
		}
	}
}
