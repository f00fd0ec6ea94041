package subnet

import (
	"net/netip"
	"strings"
	"testing"
)

func mustPrefix(t *testing.T, s string) netip.Prefix {
	t.Helper()
	p, err := netip.ParsePrefix(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestParseConfigDefaults(t *testing.T) {
	vxlan := BackendConfig{Type: BackendTypeVXLAN, VNI: 1, Port: 8472, FastPath: true}
	tests := []struct {
		name string
		json string
		want Config
	}{
		{
			name: "kube-flannel net-conf",
			json: `{"Network": "10.244.0.0/16", "EnableNFTables": false, "Backend": {"Type": "vxlan"}}`,
			want: Config{EnableIPv4: true, Network: mustPrefix(t, "10.244.0.0/16"), SubnetLen: 24,
				SubnetMin: mustAddr(t, "10.244.1.0"), SubnetMax: mustAddr(t, "10.244.255.0"), Backend: vxlan},
		},
		{
			name: "flannel README example with explicit range",
			json: `{"Network": "10.0.0.0/8", "SubnetLen": 20, "SubnetMin": "10.10.0.0", "SubnetMax": "10.99.0.0", "Backend": {"Type": "vxlan", "VNI": 1, "Port": 8472}}`,
			want: Config{EnableIPv4: true, Network: mustPrefix(t, "10.0.0.0/8"), SubnetLen: 20,
				SubnetMin: mustAddr(t, "10.10.0.0"), SubnetMax: mustAddr(t, "10.99.0.0"), Backend: vxlan},
		},
		{
			name: "flannel dual-stack example",
			json: `{"EnableIPv6": true, "Network": "10.42.0.0/16", "IPv6Network": "2001:cafe:42::/56", "Backend": {"Type": "vxlan"}}`,
			want: Config{EnableIPv4: true, EnableIPv6: true,
				Network: mustPrefix(t, "10.42.0.0/16"), SubnetLen: 24,
				SubnetMin: mustAddr(t, "10.42.1.0"), SubnetMax: mustAddr(t, "10.42.255.0"),
				IPv6Network: mustPrefix(t, "2001:cafe:42::/56"), IPv6SubnetLen: 64,
				IPv6SubnetMin: mustAddr(t, "2001:cafe:42:1::"), IPv6SubnetMax: mustAddr(t, "2001:cafe:42:ff::"),
				Backend: vxlan},
		},
		{
			name: "flannel IPv6-only example",
			json: `{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "2001:cafe:42::/56", "Backend": {"Type": "vxlan"}}`,
			want: Config{EnableIPv6: true,
				IPv6Network: mustPrefix(t, "2001:cafe:42::/56"), IPv6SubnetLen: 64,
				IPv6SubnetMin: mustAddr(t, "2001:cafe:42:1::"), IPv6SubnetMax: mustAddr(t, "2001:cafe:42:ff::"),
				Backend: vxlan},
		},
		{
			name: "no backend defaults to vxlan",
			json: `{"Network": "10.1.0.0/16"}`,
			want: Config{EnableIPv4: true, Network: mustPrefix(t, "10.1.0.0/16"), SubnetLen: 24,
				SubnetMin: mustAddr(t, "10.1.1.0"), SubnetMax: mustAddr(t, "10.1.255.0"), Backend: vxlan},
		},
		{
			name: "network /22 gets /24",
			json: `{"Network": "10.1.4.0/22"}`,
			want: Config{EnableIPv4: true, Network: mustPrefix(t, "10.1.4.0/22"), SubnetLen: 24,
				SubnetMin: mustAddr(t, "10.1.5.0"), SubnetMax: mustAddr(t, "10.1.7.0"), Backend: vxlan},
		},
		{
			name: "network /23 gets prefix+2",
			json: `{"Network": "10.1.4.0/23"}`,
			want: Config{EnableIPv4: true, Network: mustPrefix(t, "10.1.4.0/23"), SubnetLen: 25,
				SubnetMin: mustAddr(t, "10.1.4.128"), SubnetMax: mustAddr(t, "10.1.5.128"), Backend: vxlan},
		},
		{
			name: "network /28 gets /30, host bits masked",
			json: `{"Network": "10.1.4.7/28"}`,
			want: Config{EnableIPv4: true, Network: mustPrefix(t, "10.1.4.0/28"), SubnetLen: 30,
				SubnetMin: mustAddr(t, "10.1.4.4"), SubnetMax: mustAddr(t, "10.1.4.12"), Backend: vxlan},
		},
		{
			name: "field names are case-insensitive",
			json: `{"network": "10.9.0.0/16", "SUBNETLEN": 26, "subnetmin": "10.9.0.64", "backend": {"type": "VXLAN", "vni": 7, "port": 4789, "mtu": 9000, "gbp": true, "learning": true, "directrouting": true}, "enablenftables": true}`,
			want: Config{EnableIPv4: true, EnableNFTables: true, Network: mustPrefix(t, "10.9.0.0/16"), SubnetLen: 26,
				SubnetMin: mustAddr(t, "10.9.0.64"), SubnetMax: mustAddr(t, "10.9.255.192"),
				Backend: BackendConfig{Type: BackendTypeVXLAN, VNI: 7, Port: 4789, MTU: 9000, GBP: true, Learning: true, DirectRouting: true, FastPath: true}},
		},
		{
			name: "uvxlan that lets foreign inner sources through",
			json: `{"Network": "10.9.0.0/16", "Backend": {"Type": "uvxlan", "AllowForeignSources": true}}`,
			want: Config{EnableIPv4: true, Network: mustPrefix(t, "10.9.0.0/16"), SubnetLen: 24,
				SubnetMin: mustAddr(t, "10.9.1.0"), SubnetMax: mustAddr(t, "10.9.255.0"),
				Backend: BackendConfig{Type: BackendTypeUVXLAN, VNI: 1, Port: 8472, AllowForeignSources: true, FastPath: true}},
		},
		{
			name: "uvxlan with the fast path by default",
			json: `{"Network": "10.9.0.0/16", "Backend": {"Type": "uvxlan"}}`,
			want: Config{EnableIPv4: true, Network: mustPrefix(t, "10.9.0.0/16"), SubnetLen: 24,
				SubnetMin: mustAddr(t, "10.9.1.0"), SubnetMax: mustAddr(t, "10.9.255.0"),
				Backend: BackendConfig{Type: BackendTypeUVXLAN, VNI: 1, Port: 8472, FastPath: true}},
		},
		{
			name: "uvxlan with the fast path asked for",
			json: `{"Network": "10.9.0.0/16", "Backend": {"Type": "uvxlan", "fastPath": true}}`,
			want: Config{EnableIPv4: true, Network: mustPrefix(t, "10.9.0.0/16"), SubnetLen: 24,
				SubnetMin: mustAddr(t, "10.9.1.0"), SubnetMax: mustAddr(t, "10.9.255.0"),
				Backend: BackendConfig{Type: BackendTypeUVXLAN, VNI: 1, Port: 8472, FastPath: true}},
		},
		{
			name: "uvxlan with the fast path off",
			json: `{"Network": "10.9.0.0/16", "Backend": {"Type": "uvxlan", "FastPath": false}}`,
			want: Config{EnableIPv4: true, Network: mustPrefix(t, "10.9.0.0/16"), SubnetLen: 24,
				SubnetMin: mustAddr(t, "10.9.1.0"), SubnetMax: mustAddr(t, "10.9.255.0"),
				Backend: BackendConfig{Type: BackendTypeUVXLAN, VNI: 1, Port: 8472}},
		},
		{
			name: "vxlan whose uvxlan fallback runs without the fast path",
			json: `{"Network": "10.9.0.0/16", "Backend": {"Type": "vxlan", "FastPath": false}}`,
			want: Config{EnableIPv4: true, Network: mustPrefix(t, "10.9.0.0/16"), SubnetLen: 24,
				SubnetMin: mustAddr(t, "10.9.1.0"), SubnetMax: mustAddr(t, "10.9.255.0"),
				Backend: BackendConfig{Type: BackendTypeVXLAN, VNI: 1, Port: 8472}},
		},
		{
			name: "SubnetMin and SubnetMax in CIDR form",
			json: `{"Network": "10.9.0.0/16", "SubnetMin": "10.9.5.0/24", "SubnetMax": "10.9.6.0/24"}`,
			want: Config{EnableIPv4: true, Network: mustPrefix(t, "10.9.0.0/16"), SubnetLen: 24,
				SubnetMin: mustAddr(t, "10.9.5.0"), SubnetMax: mustAddr(t, "10.9.6.0"), Backend: vxlan},
		},
		{
			name: "uvxlan with VNI 0 and port 0",
			json: `{"Network": "10.9.0.0/16", "Backend": {"Type": "uvxlan", "VNI": 0, "Port": 0}}`,
			want: Config{EnableIPv4: true, Network: mustPrefix(t, "10.9.0.0/16"), SubnetLen: 24,
				SubnetMin: mustAddr(t, "10.9.1.0"), SubnetMax: mustAddr(t, "10.9.255.0"),
				Backend: BackendConfig{Type: BackendTypeUVXLAN, VNI: 0, Port: 8472, FastPath: true}},
		},
		{
			name: "explicit IPv6 subnet length and range",
			json: `{"EnableIPv6": true, "Network": "10.42.0.0/16", "IPv6Network": "fd00:42::/48", "IPv6SubnetLen": 80, "IPv6SubnetMin": "fd00:42:0:5::", "IPv6SubnetMax": "fd00:42:0:9:ffff::/80"}`,
			want: Config{EnableIPv4: true, EnableIPv6: true,
				Network: mustPrefix(t, "10.42.0.0/16"), SubnetLen: 24,
				SubnetMin: mustAddr(t, "10.42.1.0"), SubnetMax: mustAddr(t, "10.42.255.0"),
				IPv6Network: mustPrefix(t, "fd00:42::/48"), IPv6SubnetLen: 80,
				IPv6SubnetMin: mustAddr(t, "fd00:42:0:5::"), IPv6SubnetMax: mustAddr(t, "fd00:42:0:9:ffff::"),
				Backend: vxlan},
		},
		{
			name: "flannel host-gw example",
			json: `{"Network": "10.244.0.0/16", "Backend": {"Type": "host-gw"}}`,
			want: Config{EnableIPv4: true, Network: mustPrefix(t, "10.244.0.0/16"), SubnetLen: 24,
				SubnetMin: mustAddr(t, "10.244.1.0"), SubnetMax: mustAddr(t, "10.244.255.0"),
				Backend: BackendConfig{Type: BackendTypeHostGW, VNI: 1, Port: 8472, FastPath: true}},
		},
		{
			name: "flannel extension example",
			json: `{"Network": "10.0.0.0/16", "Backend": {"Type": "extension", "PreStartupCommand": "cat /x",
				"PostStartupCommand": "echo up", "SubnetAddCommand": "ip route add \"$SUBNET\" via \"$PUBLIC_IP\"",
				"SubnetRemoveCommand": "ip route del \"$SUBNET\" via \"$PUBLIC_IP\""}}`,
			want: Config{EnableIPv4: true, Network: mustPrefix(t, "10.0.0.0/16"), SubnetLen: 24,
				SubnetMin: mustAddr(t, "10.0.1.0"), SubnetMax: mustAddr(t, "10.0.255.0"),
				Backend: BackendConfig{Type: BackendTypeExtension, VNI: 1, Port: 8472, FastPath: true, PreStartupCommand: "cat /x",
					PostStartupCommand: "echo up", SubnetAddCommand: `ip route add "$SUBNET" via "$PUBLIC_IP"`,
					SubnetRemoveCommand: `ip route del "$SUBNET" via "$PUBLIC_IP"`}},
		},
		{
			name: "alloc, type in other case",
			json: `{"Network": "10.244.0.0/16", "Backend": {"Type": "Alloc"}}`,
			want: Config{EnableIPv4: true, Network: mustPrefix(t, "10.244.0.0/16"), SubnetLen: 24,
				SubnetMin: mustAddr(t, "10.244.1.0"), SubnetMax: mustAddr(t, "10.244.255.0"),
				Backend: BackendConfig{Type: BackendTypeAlloc, VNI: 1, Port: 8472, FastPath: true}},
		},
		{
			name: "IPv6 /124 gets /126",
			json: `{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fd00::/124"}`,
			want: Config{EnableIPv6: true, IPv6Network: mustPrefix(t, "fd00::/124"), IPv6SubnetLen: 126,
				IPv6SubnetMin: mustAddr(t, "fd00::4"), IPv6SubnetMax: mustAddr(t, "fd00::c"), Backend: vxlan},
		},
		{
			name: "IPv6 range wider than 64 bits ends at the real last subnet",
			json: `{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fd00:1::/48", "IPv6SubnetLen": 126}`,
			want: Config{EnableIPv6: true, IPv6Network: mustPrefix(t, "fd00:1::/48"), IPv6SubnetLen: 126,
				IPv6SubnetMin: mustAddr(t, "fd00:1::4"), IPv6SubnetMax: mustAddr(t, "fd00:1:0:ffff:ffff:ffff:ffff:fffc"), Backend: vxlan},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseConfig([]byte(tt.json))
			if err != nil {
				t.Fatal(err)
			}
			if *got != tt.want {
				t.Errorf("ParseConfig:\n got %+v\nwant %+v", *got, tt.want)
			}
		})
	}
}

func TestParseConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		json string
		want string // substring of the error
	}{
		{"not JSON", `{"Network": `, "parse network config"},
		{"both families off", `{"EnableIPv4": false}`, "EnableIPv4 and EnableIPv6 are both false"},
		{"missing Network", `{}`, "Network: missing"},
		{"Network not a CIDR", `{"Network": "10.1.0.0"}`, `Network "10.1.0.0": not a CIDR`},
		{"Network is IPv6", `{"Network": "fd00::/48"}`, "must be an IPv4 CIDR"},
		{"IPv6Network is IPv4", `{"Network": "10.1.0.0/16", "EnableIPv6": true, "IPv6Network": "10.2.0.0/16"}`, "IPv6Network \"10.2.0.0/16\": must be an IPv6 CIDR"},
		{"missing IPv6Network", `{"Network": "10.1.0.0/16", "EnableIPv6": true}`, "IPv6Network: missing"},
		{"Network too small", `{"Network": "10.1.0.0/29"}`, "too small, must be /28 or larger"},
		{"IPv6Network too small", `{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fd00::/125"}`, "IPv6Network fd00::/125: too small, must be /124 or larger"},
		{"SubnetLen above 30", `{"Network": "10.1.0.0/16", "SubnetLen": 31}`, "SubnetLen 31: must be at most 30"},
		{"SubnetLen too short", `{"Network": "10.1.0.0/16", "SubnetLen": 17}`, "SubnetLen 17: must be at least 18"},
		{"SubnetLen negative", `{"Network": "10.1.0.0/16", "SubnetLen": -1}`, "must not be negative"},
		{"IPv6SubnetLen above 126", `{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fd00::/64", "IPv6SubnetLen": 127}`, "IPv6SubnetLen 127: must be at most 126"},
		{"SubnetMin not an address", `{"Network": "10.1.0.0/16", "SubnetMin": "x"}`, `SubnetMin "x": not an address`},
		{"SubnetMin outside", `{"Network": "10.1.0.0/16", "SubnetMin": "10.2.0.0"}`, "SubnetMin 10.2.0.0: not inside Network 10.1.0.0/16"},
		{"SubnetMax unaligned", `{"Network": "10.1.0.0/16", "SubnetMax": "10.1.9.1"}`, "SubnetMax 10.1.9.1: not aligned to SubnetLen 24"},
		{"SubnetMin after SubnetMax", `{"Network": "10.1.0.0/16", "SubnetMin": "10.1.9.0", "SubnetMax": "10.1.8.0"}`, "SubnetMin 10.1.9.0: must not be after SubnetMax 10.1.8.0"},
		{"IPv6SubnetMin unaligned", `{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fd00::/56", "IPv6SubnetMin": "fd00::1"}`, "IPv6SubnetMin fd00::1: not aligned to IPv6SubnetLen 64"},
		{"udp backend", `{"Network": "10.1.0.0/16", "Backend": {"Type": "udp", "Port": 7890}}`, `Backend.Type: backend "udp": Flannel's udp backend is not supported; use "uvxlan", weft's userspace VXLAN`},
		{"ipsec backend", `{"Network": "10.1.0.0/16", "Backend": {"Type": "IPsec"}}`, `Backend.Type: backend "ipsec": Flannel's ipsec backend is not supported; use "wireguard"`},
		{"unknown backend", `{"Network": "10.1.0.0/16", "Backend": {"Type": "gre"}}`, `Backend.Type: backend "gre": unknown, weft runs "vxlan", "uvxlan", "host-gw", "wireguard", "extension" or "alloc"`},
		{"ipip backend", `{"Network": "10.1.0.0/16", "Backend": {"Type": "ipip", "DirectRouting": true}}`, `Backend.Type: backend "ipip": Flannel's ipip backend is not supported yet; use "vxlan"`},
		{"command on vxlan", `{"Network": "10.1.0.0/16", "Backend": {"Type": "vxlan", "SubnetAddCommand": "true"}}`, `Backend.SubnetAddCommand: only the "extension" backend runs commands, not "vxlan"`},
		{"VNI too big", `{"Network": "10.1.0.0/16", "Backend": {"VNI": 16777216}}`, "Backend.VNI 16777216: must be between 0 and 16777215"},
		{"VNI negative", `{"Network": "10.1.0.0/16", "Backend": {"VNI": -1}}`, "Backend.VNI -1"},
		{"Port too big", `{"Network": "10.1.0.0/16", "Backend": {"Port": 70000}}`, "Backend.Port 70000: must be between 1 and 65535"},
		{"MTU too small", `{"Network": "10.1.0.0/16", "Backend": {"MTU": 500}}`, "Backend.MTU 500"},
		{"uvxlan with GBP", `{"Network": "10.1.0.0/16", "Backend": {"Type": "uvxlan", "GBP": true}}`, "not supported by the uvxlan backend"},
		{"fast path on host-gw", `{"Network": "10.1.0.0/16", "Backend": {"Type": "host-gw", "FastPath": false}}`, `Backend.FastPath: only the "uvxlan" backend has a fast path (and "vxlan", which falls back to it), not "host-gw"`},
		{"fast path a string", `{"Network": "10.1.0.0/16", "Backend": {"Type": "uvxlan", "FastPath": "false"}}`, `network config: Backend.FastPath: a JSON string, want a bool`},
		{"fast path a number", `{"Network": "10.1.0.0/16", "Backend": {"Type": "uvxlan", "FastPath": 0}}`, `network config: Backend.FastPath: a JSON number, want a bool`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(tt.json))
			if err == nil {
				t.Fatalf("ParseConfig succeeded with %+v, want error containing %q", cfg, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

func TestSubnetCountAtFits(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"EnableIPv6": true, "Network": "10.244.0.0/16", "IPv6Network": "fd00:10:244::/48"}`))
	if err != nil {
		t.Fatal(err)
	}
	if n := cfg.SubnetCount(false); n != 255 {
		t.Errorf("SubnetCount(v4) = %d, want 255", n)
	}
	if n := cfg.SubnetCount(true); n != 65535 {
		t.Errorf("SubnetCount(v6) = %d, want 65535", n)
	}
	testSubnetAt(t, cfg)
	testFits(t, cfg)
}

func testSubnetAt(t *testing.T, cfg *Config) {
	at := []struct {
		v6   bool
		i    uint64
		want string
	}{
		{false, 0, "10.244.1.0/24"},
		{false, 254, "10.244.255.0/24"},
		{true, 0, "fd00:10:244:1::/64"},
		{true, 65534, "fd00:10:244:ffff::/64"},
	}
	for _, tt := range at {
		if got := cfg.SubnetAt(tt.v6, tt.i); got != mustPrefix(t, tt.want) {
			t.Errorf("SubnetAt(%t, %d) = %s, want %s", tt.v6, tt.i, got, tt.want)
		}
	}
}

func testFits(t *testing.T, cfg *Config) {
	fits := []struct {
		prefix string
		want   bool
	}{
		{"10.244.1.0/24", true},
		{"10.244.255.0/24", true},
		{"10.244.0.0/24", false}, // the first subnet is never handed out
		{"10.244.3.0/25", false}, // wrong length
		{"10.244.3.1/24", false}, // not masked
		{"10.245.0.0/24", false}, // outside
		{"fd00:10:244:7::/64", true},
		{"fd00:10:244::/64", false},
		{"fd00:10:245::/64", false},
		{"fd00:10:244:7::/80", false},
	}
	for _, tt := range fits {
		if got := cfg.Fits(mustPrefix(t, tt.prefix)); got != tt.want {
			t.Errorf("Fits(%s) = %t, want %t", tt.prefix, got, tt.want)
		}
	}
	if cfg.Fits(netip.Prefix{}) {
		t.Error("Fits(invalid prefix) = true")
	}
}

func TestSubnetCountSmallAndHuge(t *testing.T) {

	v4only, err := ParseConfig([]byte(`{"Network": "10.1.0.0/28", "SubnetLen": 30}`))
	if err != nil {
		t.Fatal(err)
	}
	if n := v4only.SubnetCount(false); n != 3 {
		t.Errorf("/28 with /30: SubnetCount = %d, want 3", n)
	}
	if n := v4only.SubnetCount(true); n != 0 {
		t.Errorf("IPv6 off: SubnetCount(v6) = %d, want 0", n)
	}
	if v4only.Fits(mustPrefix(t, "fd00::/64")) {
		t.Error("IPv6 off: Fits(fd00::/64) = true")
	}

	huge, err := ParseConfig([]byte(`{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fd00::/32", "IPv6SubnetLen": 126}`))
	if err != nil {
		t.Fatal(err)
	}
	if n := huge.SubnetCount(true); n != 1<<63 {
		t.Errorf("2^94 subnets: SubnetCount = %d, want the 2^63 cap", n)
	}
	if !huge.Fits(mustPrefix(t, "fd00:0:ffff:ffff:ffff:ffff:ffff:fffc/126")) {
		t.Error("the last /126 of fd00::/32 does not fit")
	}
}
