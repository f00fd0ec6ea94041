package wireguard

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func ip(s string) netip.Addr    { return netip.MustParseAddr(s) }

// Keys from `wg genkey | wg pubkey`-style base64, fixed for the test.
const (
	keyA = "hBxRKTKWx1m2Q7V5rHeRbg0hJ3o4I3eAq6bqg0Q3HkA="
	keyB = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="
)

func table() vtep.Table {
	return vtep.Table{
		pfx("10.244.2.0/24"):      {Addr: ip("192.168.77.2"), Data: keyA, Port: 51820},
		pfx("fd00:10:244:2::/64"): {Addr: ip("fd77::2"), Data: keyA, Port: 51821},
		pfx("10.244.3.0/24"):      {Addr: ip("192.168.77.3"), Data: keyB}, // no port in the lease
	}
}

func baseConfig(mode string) Config {
	return Config{Mode: mode, ListenPort: 51820, ListenPortV6: 51821,
		Subnet: pfx("10.244.1.0/24"), IPv6Subnet: pfx("fd00:10:244:1::/64"),
		Network: pfx("10.244.0.0/16"), IPv6Network: pfx("fd00:10:244::/56"),
		Local: ip("192.168.77.1"), LocalIPv6: ip("fd77::1")}
}

func TestDevicesAndPeersByMode(t *testing.T) {
	tests := []struct {
		mode  string
		devs  []string
		peers map[string][]Peer
	}{
		{subnet.WireGuardSeparate, []string{"flannel-wg", "flannel-wg-v6"}, map[string][]Peer{
			"flannel-wg": {
				{Key: keyA, Endpoint: netip.MustParseAddrPort("192.168.77.2:51820"), AllowedIPs: []netip.Prefix{pfx("10.244.2.0/24")}},
				{Key: keyB, Endpoint: netip.MustParseAddrPort("192.168.77.3:51820"), AllowedIPs: []netip.Prefix{pfx("10.244.3.0/24")}}},
			"flannel-wg-v6": {
				{Key: keyA, Endpoint: netip.MustParseAddrPort("[fd77::2]:51821"), AllowedIPs: []netip.Prefix{pfx("fd00:10:244:2::/64")}}},
		}},
		{subnet.WireGuardIPv4, []string{"flannel-wg"}, map[string][]Peer{"flannel-wg": {
			{Key: keyA, Endpoint: netip.MustParseAddrPort("192.168.77.2:51820"), AllowedIPs: []netip.Prefix{pfx("10.244.2.0/24"), pfx("fd00:10:244:2::/64")}},
			{Key: keyB, Endpoint: netip.MustParseAddrPort("192.168.77.3:51820"), AllowedIPs: []netip.Prefix{pfx("10.244.3.0/24")}}}}},
		{subnet.WireGuardIPv6, []string{"flannel-wg"}, map[string][]Peer{"flannel-wg": {
			{Key: keyA, Endpoint: netip.MustParseAddrPort("[fd77::2]:51821"), AllowedIPs: []netip.Prefix{pfx("10.244.2.0/24"), pfx("fd00:10:244:2::/64")}}}}},
		// Private addresses on both sides: auto keeps IPv4, as Flannel.
		{subnet.WireGuardAuto, []string{"flannel-wg"}, map[string][]Peer{"flannel-wg": {
			{Key: keyA, Endpoint: netip.MustParseAddrPort("192.168.77.2:51820"), AllowedIPs: []netip.Prefix{pfx("10.244.2.0/24"), pfx("fd00:10:244:2::/64")}},
			{Key: keyB, Endpoint: netip.MustParseAddrPort("192.168.77.3:51820"), AllowedIPs: []netip.Prefix{pfx("10.244.3.0/24")}}}}},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			c := baseConfig(tc.mode)
			var names []string
			for _, d := range c.specs() {
				names = append(names, d.name)
				if got := c.peersFor(d, table()); !reflect.DeepEqual(got, tc.peers[d.name]) {
					t.Errorf("%s peers:\n got %+v\nwant %+v", d.name, got, tc.peers[d.name])
				}
			}
			if !reflect.DeepEqual(names, tc.devs) {
				t.Errorf("devices %v, want %v", names, tc.devs)
			}
		})
	}
}

func TestAutoPicksPublicIPv6(t *testing.T) {
	c := baseConfig(subnet.WireGuardAuto)
	c.LocalIPv6 = ip("2001:db8::1")
	t6 := vtep.Table{
		pfx("10.244.2.0/24"):      {Addr: ip("10.0.0.2"), Data: keyA, Port: 51820},
		pfx("fd00:10:244:2::/64"): {Addr: ip("2001:db8::2"), Data: keyA, Port: 51820},
	}
	got := c.peersFor(c.specs()[0], t6)
	if len(got) != 1 || got[0].Endpoint != netip.MustParseAddrPort("[2001:db8::2]:51820") {
		t.Fatalf("auto with public IPv6 on both sides and a private IPv4: %+v", got)
	}
}

// TestWhatTheKernelWouldGet pins the wgctrl configuration and the UAPI text
// for one peer set and one removal.
func TestWhatTheKernelWouldGet(t *testing.T) {
	c := baseConfig(subnet.WireGuardSeparate)
	psk, _ := wgtypes.ParseKey(keyB)
	c.PSK, c.Keepalive = &psk, 25
	priv, _ := wgtypes.ParseKey(keyA)
	p := Peer{Key: keyA, Endpoint: netip.MustParseAddrPort("192.168.77.2:51820"), AllowedIPs: []netip.Prefix{pfx("10.244.2.0/24")}}
	cfg, err := c.kernelConfig(&priv, 51820, []Peer{p}, []string{keyB})
	if err != nil {
		t.Fatal(err)
	}
	ka := 25 * time.Second
	pkA, _ := wgtypes.ParseKey(keyA)
	pkB, _ := wgtypes.ParseKey(keyB)
	port := 51820
	want := wgtypes.Config{PrivateKey: &priv, ListenPort: &port, Peers: []wgtypes.PeerConfig{
		{PublicKey: pkB, Remove: true},
		{PublicKey: pkA, PresharedKey: &psk, Endpoint: &net.UDPAddr{IP: net.ParseIP("192.168.77.2").To4(), Port: 51820},
			PersistentKeepaliveInterval: &ka, ReplaceAllowedIPs: true,
			AllowedIPs: []net.IPNet{{IP: net.IP{10, 244, 2, 0}, Mask: net.CIDRMask(24, 32)}}},
	}}
	if cfg.ListenPort == nil || *cfg.ListenPort != 51820 {
		t.Errorf("listen port %v", cfg.ListenPort)
	}
	cfg.ListenPort, want.ListenPort = nil, nil
	if fmt.Sprintf("%+v", cfg) != fmt.Sprintf("%+v", want) || cfg.Peers[1].Endpoint.String() != "192.168.77.2:51820" {
		t.Errorf("kernel config\n got %+v\nwant %+v", cfg, want)
	}
	text, err := c.uapi(nil, 0, []Peer{p}, []string{keyB})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(text), "\n")
	wantLines := []string{
		"public_key=" + fmt.Sprintf("%x", pkB[:]), "remove=true",
		"public_key=" + fmt.Sprintf("%x", pkA[:]), "preshared_key=" + fmt.Sprintf("%x", psk[:]),
		"endpoint=192.168.77.2:51820", "persistent_keepalive_interval=25", "replace_allowed_ips=true", "allowed_ip=10.244.2.0/24",
	}
	if !reflect.DeepEqual(lines, wantLines) {
		t.Errorf("uapi:\n%s\nwant:\n%s", text, strings.Join(wantLines, "\n"))
	}
	peers, err := parseUAPIPeers("private_key=00\nlisten_port=51820\npublic_key=" + fmt.Sprintf("%x", pkA[:]) +
		"\nendpoint=192.168.77.2:51820\nallowed_ip=10.244.2.0/24\nallowed_ip=fd00:10:244:2::/64\nlast_handshake_time_sec=0\n")
	if err != nil || !reflect.DeepEqual(peers[keyA].AllowedIPs, []netip.Prefix{pfx("10.244.2.0/24"), pfx("fd00:10:244:2::/64")}) ||
		peers[keyA].Endpoint != netip.MustParseAddrPort("192.168.77.2:51820") {
		t.Errorf("parse uapi: %+v %v", peers, err)
	}
}

func TestKernelSelection(t *testing.T) {
	tests := []struct {
		err    error
		kernel bool
		fail   bool
	}{
		{nil, true, false},
		{unix.EEXIST, true, false},
		{fmt.Errorf("link add: %w", unix.EOPNOTSUPP), false, false},
		{unix.ENODEV, false, false},
		{unix.EPERM, false, true},
	}
	for _, tc := range tests {
		k, err := kernelSupported(tc.err)
		if k != tc.kernel || (err != nil) != tc.fail {
			t.Errorf("kernelSupported(%v) = %v, %v", tc.err, k, err)
		}
	}
}

func TestKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "flannel", "wgkey")
	k1, created, err := LoadOrCreateKey(path)
	if err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o400 {
		t.Fatalf("mode %v %v", fi.Mode(), err)
	}
	b, _ := os.ReadFile(path)
	if string(b) != k1.String() {
		t.Errorf("file holds %q, want the base64 key %q", b, k1)
	}
	k2, created, err := LoadOrCreateKey(path)
	if err != nil || created || k2 != k1 {
		t.Fatalf("reload: %v %v same=%v", created, err, k2 == k1)
	}
	bad := filepath.Join(t.TempDir(), "bad")
	os.WriteFile(bad, []byte("not a key"), 0o400)
	if _, _, err := LoadOrCreateKey(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("bad key file: %v", err)
	}
	t.Setenv(KeyFileEnv, "/x/y")
	if KeyFile() != "/x/y" {
		t.Error("WIREGUARD_KEY_FILE ignored")
	}
	os.Unsetenv(KeyFileEnv)
	if KeyFile() != "/run/flannel/wgkey" {
		t.Errorf("default %q", KeyFile())
	}
}

func TestLeaseData(t *testing.T) {
	k, _ := wgtypes.ParseKey(keyA)
	for _, tc := range []struct {
		mode   string
		v6Port uint16
	}{{subnet.WireGuardSeparate, 51821}, {subnet.WireGuardAuto, 51820}} {
		v4, v6 := LeaseData(k, subnet.BackendConfig{Mode: tc.mode, ListenPort: 51820, ListenPortV6: 51821})
		if v4 != (subnet.WireGuardData{PublicKey: keyA, Port: 51820}) || v6 != (subnet.WireGuardData{PublicKey: keyA, Port: tc.v6Port}) {
			t.Errorf("%s: %+v %+v", tc.mode, v4, v6)
		}
	}
}
