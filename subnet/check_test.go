package subnet

import (
	"bytes"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
)

func checkConfig(t *testing.T, js string) *Config {
	t.Helper()
	cfg, err := ParseConfig([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func vxlanLease(sub, pub string, vni int) Lease {
	return Lease{Subnet: netip.MustParsePrefix(sub), Attrs: LeaseAttrs{
		PublicIP: netip.MustParseAddr(pub), BackendType: BackendTypeVXLAN,
		BackendData: &VXLANData{VNI: vni, VtepMAC: MAC{0x4e, 1, 2, 3, 4, 5}}}}
}

func TestCheckLease(t *testing.T) {
	v4 := checkConfig(t, `{"Network":"10.244.0.0/16"}`)
	uv := checkConfig(t, `{"Network":"10.244.0.0/16","Backend":{"Type":"uvxlan","VNI":7}}`)
	dual := checkConfig(t, `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56"}`)
	v6only := checkConfig(t, `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/56"}`)
	good := vxlanLease("10.244.3.0/24", "192.168.1.3", 1)
	with := func(l Lease, f func(*Lease)) Lease {
		if l.Attrs.BackendData != nil {
			d := *l.Attrs.BackendData
			l.Attrs.BackendData = &d
		}
		f(&l)
		return l
	}
	goodDual := with(good, func(l *Lease) {
		l.IPv6Subnet = netip.MustParsePrefix("fd00:10:244:3::/64")
		l.Attrs.PublicIPv6 = netip.MustParseAddr("2001:db8::3")
		l.Attrs.BackendV6Data = &VXLANData{VNI: 1, VtepMAC: MAC{0x4e, 6, 6, 6, 6, 6}}
	})
	goodV6 := Lease{IPv6Subnet: goodDual.IPv6Subnet, Attrs: LeaseAttrs{PublicIPv6: goodDual.Attrs.PublicIPv6,
		BackendType: BackendTypeVXLAN, BackendV6Data: goodDual.Attrs.BackendV6Data}}
	tests := []struct {
		name string
		cfg  *Config
		lens PrefixLens
		l    Lease
		want string // reason, "" for accepted
	}{
		{"a valid IPv4 lease", v4, PrefixLens{}, good, ""},
		{"a valid dual-stack lease", dual, PrefixLens{}, goodDual, ""},
		{"a valid IPv6-only lease", v6only, PrefixLens{}, goodV6, ""},
		{"uvxlan cluster: vxlan lease with its VNI", uv, PrefixLens{}, with(good, func(l *Lease) { l.Attrs.BackendData.VNI = 7 }), ""},
		{"route hijack 0.0.0.0/1", v4, PrefixLens{}, with(good, func(l *Lease) { l.Subnet = netip.MustParsePrefix("0.0.0.0/1") }), RejectOutsideNetwork},
		{"outside the network", v4, PrefixLens{}, with(good, func(l *Lease) { l.Subnet = netip.MustParsePrefix("10.250.0.0/24") }), RejectOutsideNetwork},
		{"the whole network", v4, PrefixLens{}, with(good, func(l *Lease) { l.Subnet = netip.MustParsePrefix("10.244.0.0/15") }), RejectOutsideNetwork},
		{"IPv6 outside the network", dual, PrefixLens{}, with(goodDual, func(l *Lease) { l.IPv6Subnet = netip.MustParsePrefix("fd00:99::/64") }), RejectOutsideNetwork},
		{"IPv6 default route", v6only, PrefixLens{}, with(goodV6, func(l *Lease) { l.IPv6Subnet = netip.MustParsePrefix("::/0") }), RejectOutsideNetwork},
		{"wider than a node subnet", v4, PrefixLens{}, with(good, func(l *Lease) { l.Subnet = netip.MustParsePrefix("10.244.0.0/20") }), RejectPrefixLength},
		{"narrower than a node subnet", v4, PrefixLens{}, with(good, func(l *Lease) { l.Subnet = netip.MustParsePrefix("10.244.3.128/25") }), RejectPrefixLength},
		{"the length of self's subnet (Kubernetes)", v4, PrefixLens{V4: 25}, with(good, func(l *Lease) { l.Subnet = netip.MustParsePrefix("10.244.3.128/25") }), ""},
		{"IPv6 of another length", dual, PrefixLens{}, with(goodDual, func(l *Lease) { l.IPv6Subnet = netip.MustParsePrefix("fd00:10:244:3::/80") }), RejectPrefixLength},
		{"wrong VNI", v4, PrefixLens{}, with(good, func(l *Lease) { l.Attrs.BackendData.VNI = 2 }), RejectBackendData},
		{"no backend data", v4, PrefixLens{}, with(good, func(l *Lease) { l.Attrs.BackendData = nil }), RejectBackendData},
		{"zero VTEP MAC", v4, PrefixLens{}, with(good, func(l *Lease) { l.Attrs.BackendData.VtepMAC = MAC{} }), RejectBackendData},
		{"multicast VTEP MAC", v4, PrefixLens{}, with(good, func(l *Lease) { l.Attrs.BackendData.VtepMAC = MAC{1, 0, 0x5e, 0, 0, 1} }), RejectBackendData},
		{"dual-stack: wrong IPv6 VNI", dual, PrefixLens{}, with(goodDual, func(l *Lease) { l.Attrs.BackendV6Data = &VXLANData{VNI: 9, VtepMAC: MAC{2, 1, 1, 1, 1, 1}} }), RejectBackendData},
		{"another backend type", v4, PrefixLens{}, with(good, func(l *Lease) { l.Attrs.BackendType = "host-gw" }), RejectBackendType},
		{"uvxlan written in a lease", uv, PrefixLens{}, with(good, func(l *Lease) { l.Attrs.BackendType = BackendTypeUVXLAN }), RejectBackendType},
		{"an IPv6 subnet in an IPv4 cluster", v4, PrefixLens{}, goodDual, RejectFamily},
		{"no IPv6 subnet in a dual-stack cluster", dual, PrefixLens{}, good, RejectFamily},
		{"loopback public IP", v4, PrefixLens{}, with(good, func(l *Lease) { l.Attrs.PublicIP = netip.MustParseAddr("127.0.0.1") }), RejectPublicIP},
		{"multicast public IP", v4, PrefixLens{}, with(good, func(l *Lease) { l.Attrs.PublicIP = netip.MustParseAddr("239.1.1.1") }), RejectPublicIP},
		{"broadcast public IP", v4, PrefixLens{}, with(good, func(l *Lease) { l.Attrs.PublicIP = netip.MustParseAddr("255.255.255.255") }), RejectPublicIP},
		{"link-local public IP", v4, PrefixLens{}, with(good, func(l *Lease) { l.Attrs.PublicIP = netip.MustParseAddr("169.254.1.1") }), RejectPublicIP},
		{"no public IP", v4, PrefixLens{}, with(good, func(l *Lease) { l.Attrs.PublicIP = netip.Addr{} }), RejectPublicIP},
		{"public IP inside the pod network", v4, PrefixLens{}, with(good, func(l *Lease) { l.Attrs.PublicIP = netip.MustParseAddr("10.244.9.9") }), RejectPublicIP},
		{"IPv6 loopback", dual, PrefixLens{}, with(goodDual, func(l *Lease) { l.Attrs.PublicIPv6 = netip.IPv6Loopback() }), RejectPublicIP},
		{"IPv6 link-local", dual, PrefixLens{}, with(goodDual, func(l *Lease) { l.Attrs.PublicIPv6 = netip.MustParseAddr("fe80::1") }), RejectPublicIP},
		{"IPv6 inside the pod network", dual, PrefixLens{}, with(goodDual, func(l *Lease) { l.Attrs.PublicIPv6 = netip.MustParseAddr("fd00:10:244:3::9") }), RejectPublicIP},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.CheckLease(tt.l, tt.lens)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("rejected a valid lease: %v", err)
				}
				return
			}
			var re *RejectError
			if !errors.As(err, &re) {
				t.Fatalf("accepted %+v (err %v), want rejected for %s", tt.l, err, tt.want)
			}
			if re.Reason != tt.want || RejectReason(err) != tt.want {
				t.Fatalf("rejected for %s (%v), want %s", re.Reason, err, tt.want)
			}
		})
	}
}

func TestLeaseBackendType(t *testing.T) {
	for cfg, want := range map[string]string{"vxlan": "vxlan", "uvxlan": "vxlan", "host-gw": "host-gw", "wireguard": "wireguard", "alloc": ""} {
		if got := LeaseBackendType(cfg); got != want {
			t.Errorf("LeaseBackendType(%q) = %q, want %q", cfg, got, want)
		}
	}
}

func TestRejectionsLogAndCountOncePerKey(t *testing.T) {
	var buf bytes.Buffer
	counts := map[string]int{}
	r := NewRejections(slog.New(slog.NewTextHandler(&buf, nil)), func(reason string) { counts[reason]++ })
	err := errors.New("bad")
	for range 3 {
		r.Reject("0.0.0.0-1", RejectOutsideNetwork, err)
	}
	r.Reject("10.244.3.0-24", RejectBackendData, err)
	r.Reject("10.244.3.0-24", RejectPublicIP, err) // another reason for the same key: a new rejection
	r.Forget("0.0.0.0-1")
	r.Reject("0.0.0.0-1", RejectOutsideNetwork, err) // deleted and written again
	want := map[string]int{RejectOutsideNetwork: 2, RejectBackendData: 1, RejectPublicIP: 1}
	for k, v := range want {
		if counts[k] != v {
			t.Errorf("count %s = %d, want %d (all %v)", k, counts[k], v, counts)
		}
	}
	if n := strings.Count(buf.String(), "key=0.0.0.0-1"); n != 2 {
		t.Errorf("key 0.0.0.0-1 logged %d times, want 2:\n%s", n, buf.String())
	}
	var nilRec *Rejections
	nilRec.Reject("k", RejectFamily, err) // must not panic
	nilRec.Forget("k")
}

func TestCheckLeaseOtherBackends(t *testing.T) {
	hg := checkConfig(t, `{"Network":"10.244.0.0/16","Backend":{"Type":"host-gw"}}`)
	wg := checkConfig(t, `{"Network":"10.244.0.0/16","Backend":{"Type":"wireguard"}}`)
	al := checkConfig(t, `{"Network":"10.244.0.0/16","Backend":{"Type":"alloc"}}`)
	base := func(typ string) Lease {
		return Lease{Subnet: netip.MustParsePrefix("10.244.3.0/24"), Attrs: LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.1.3"), BackendType: typ}}
	}
	wgLease := func(key string) Lease {
		l := base(BackendTypeWireGuard)
		l.Attrs.WireGuard = &WireGuardData{PublicKey: key, Port: 51820}
		return l
	}
	tests := []struct {
		name string
		cfg  *Config
		l    Lease
		want string
	}{
		{"host-gw lease", hg, base(BackendTypeHostGW), ""},
		{"vxlan lease in a host-gw cluster", hg, vxlanLease("10.244.3.0/24", "192.168.1.3", 1), RejectBackendType},
		{"alloc lease (no type, as flanneld's)", al, base(""), ""},
		{"wireguard lease", wg, wgLease("hBxRKTKWx1m2Q7V5rHeRbg0hJ3o4I3eAq6bqg0Q3HkA="), ""},
		{"wireguard lease without data", wg, base(BackendTypeWireGuard), RejectBackendData},
		{"wireguard lease with a bad key", wg, wgLease("not-a-key"), RejectBackendData},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.CheckLease(tt.l, PrefixLens{})
			if got := map[bool]string{true: "", false: RejectReason(err)}[err == nil]; got != tt.want {
				t.Fatalf("got %q (%v), want %q", got, err, tt.want)
			}
		})
	}
}
