package kube

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weft-net/weft/subnet"
)

func mustConfig(t *testing.T, js string) *subnet.Config {
	t.Helper()
	cfg, err := subnet.ParseConfig([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func testNode(ann map[string]string, cidrs ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: ann}}
	if len(cidrs) > 0 {
		n.Spec.PodCIDR = cidrs[0]
		n.Spec.PodCIDRs = cidrs
	}
	return n
}

const p = DefaultAnnotationPrefix + "/"

func TestNodeLease(t *testing.T) {
	v4 := mustConfig(t, `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`)
	dual := mustConfig(t, `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}`)
	mac := subnet.MAC{0x4e, 0xfb, 0x7d, 0xbf, 0x6b, 0x2d}
	good := map[string]string{
		p + "kube-subnet-manager": "true",
		p + "backend-type":        "vxlan",
		p + "backend-data":        `{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:2d"}`,
		p + "public-ip":           "192.168.77.1",
	}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range good {
			m[a] = b
		}
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	tests := []struct {
		name     string
		cfg      *subnet.Config
		node     *corev1.Node
		want     subnet.Lease
		notLease bool
		bad      bool
	}{
		{name: "flannel vxlan node", cfg: v4, node: testNode(good, "10.244.3.0/24"), want: subnet.Lease{
			Subnet: netip.MustParsePrefix("10.244.3.0/24"),
			Attrs: subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.77.1"), BackendType: "vxlan",
				BackendData: &subnet.VXLANData{VNI: 1, VtepMAC: mac}},
		}},
		{name: "dual stack", cfg: dual, node: testNode(with(p+"public-ipv6", "fd77::1"), "10.244.3.0/24", "fd00:10:244:3::/64"), notLease: true},
		{name: "dual stack complete", cfg: dual, node: testNode(func() map[string]string {
			m := with(p+"public-ipv6", "fd77::1")
			m[p+"backend-v6-data"] = `{"VNI":1,"VtepMAC":"4e:fb:7d:bf:6b:2d"}`
			return m
		}(), "10.244.3.0/24", "fd00:10:244:3::/64"), want: subnet.Lease{
			Subnet:     netip.MustParsePrefix("10.244.3.0/24"),
			IPv6Subnet: netip.MustParsePrefix("fd00:10:244:3::/64"),
			Attrs: subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.77.1"), PublicIPv6: netip.MustParseAddr("fd77::1"),
				BackendType: "vxlan", BackendData: &subnet.VXLANData{VNI: 1, VtepMAC: mac}, BackendV6Data: &subnet.VXLANData{VNI: 1, VtepMAC: mac}},
		}},
		{name: "host-gw peer keeps no data", cfg: v4, node: testNode(with(p+"backend-type", "host-gw"), "10.244.3.0/24"), want: subnet.Lease{
			Subnet: netip.MustParsePrefix("10.244.3.0/24"),
			Attrs:  subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.77.1"), BackendType: "host-gw"},
		}},
		{name: "no marker", cfg: v4, node: testNode(with(p+"kube-subnet-manager", ""), "10.244.3.0/24"), notLease: true},
		{name: "marker false", cfg: v4, node: testNode(with(p+"kube-subnet-manager", "false"), "10.244.3.0/24"), notLease: true},
		{name: "no podCIDR", cfg: v4, node: testNode(good), notLease: true},
		{name: "no backend type", cfg: v4, node: testNode(with(p+"backend-type", ""), "10.244.3.0/24"), notLease: true},
		{name: "no public ip", cfg: v4, node: testNode(with(p+"public-ip", ""), "10.244.3.0/24"), notLease: true},
		{name: "no backend data", cfg: v4, node: testNode(with(p+"backend-data", ""), "10.244.3.0/24"), notLease: true},
		{name: "bad public ip", cfg: v4, node: testNode(with(p+"public-ip", "fd77::1"), "10.244.3.0/24"), bad: true},
		{name: "bad backend data", cfg: v4, node: testNode(with(p+"backend-data", `{"VNI":1,"VtepMAC":"zz"}`), "10.244.3.0/24"), bad: true},
		{name: "bad podCIDR", cfg: v4, node: testNode(good, "10.244.3.0"), bad: true},
	}
	ann, err := newAnnotations(DefaultAnnotationPrefix)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ann.nodeLease(tt.cfg, tt.node)
			switch {
			case tt.notLease:
				if !errors.Is(err, errNotLease) {
					t.Fatalf("nodeLease: got %+v, %v; want errNotLease", got, err)
				}
			case tt.bad:
				if err == nil || errors.Is(err, errNotLease) {
					t.Fatalf("nodeLease: got %+v, %v; want a parse error", got, err)
				}
			case err != nil:
				t.Fatalf("nodeLease: %v", err)
			case !sameLease(got, tt.want):
				t.Fatalf("nodeLease:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestEffectiveAttrs(t *testing.T) {
	attrs := subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.1.1"), PublicIPv6: netip.MustParseAddr("fd01::1"), BackendType: "vxlan"}
	tests := []struct {
		name    string
		ann     map[string]string
		want4   string
		want6   string
		wantErr bool
	}{
		{name: "none", want4: "192.168.1.1", want6: "fd01::1"},
		{name: "overwrite", ann: map[string]string{p + "public-ip-overwrite": "10.0.0.9"}, want4: "10.0.0.9", want6: "fd01::1"},
		{name: "node-public-ip", ann: map[string]string{p + "node-public-ip": "10.0.0.8", p + "node-public-ipv6": "fd02::8"}, want4: "10.0.0.8", want6: "fd02::8"},
		{name: "overwrite beats node-public-ip", ann: map[string]string{p + "public-ip-overwrite": "10.0.0.9", p + "node-public-ip": "10.0.0.8"}, want4: "10.0.0.9", want6: "fd01::1"},
		{name: "v6 overwrite", ann: map[string]string{p + "public-ipv6-overwrite": "fd03::3"}, want4: "192.168.1.1", want6: "fd03::3"},
		{name: "wrong family", ann: map[string]string{p + "public-ip-overwrite": "fd03::3"}, wantErr: true},
		{name: "garbage", ann: map[string]string{p + "node-public-ipv6": "x"}, wantErr: true},
	}
	ann, _ := newAnnotations(DefaultAnnotationPrefix + "/")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ann.effectiveAttrs(testNode(tt.ann), attrs)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("effectiveAttrs: got %+v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.PublicIP.String() != tt.want4 || got.PublicIPv6.String() != tt.want6 {
				t.Fatalf("effectiveAttrs: got %s %s, want %s %s", got.PublicIP, got.PublicIPv6, tt.want4, tt.want6)
			}
		})
	}
}

// TestAnnotationPrefix checks the annotation keys each prefix makes, those
// that flanneld's --kube-annotation-prefix makes from it, and refuses
// prefixes that are not one or that make keys Kubernetes refuses.
func TestAnnotationPrefix(t *testing.T) {
	for _, tt := range []struct{ prefix, backendData, nodePublicIPv6 string }{
		{"flannel.alpha.coreos.com", "flannel.alpha.coreos.com/backend-data", "flannel.alpha.coreos.com/node-public-ipv6"},
		{"flannel.alpha.coreos.com/", "flannel.alpha.coreos.com/backend-data", "flannel.alpha.coreos.com/node-public-ipv6"},
		{"example.com/flannel", "example.com/flannel-backend-data", "example.com/flannel-node-public-ipv6"},
		{"example.com/flannel-", "example.com/flannel-backend-data", "example.com/flannel-node-public-ipv6"},
		{"net.example.com/cluster_a", "net.example.com/cluster_a-backend-data", "net.example.com/cluster_a-node-public-ipv6"},
		{"weft", "weft/backend-data", "weft/node-public-ipv6"},
	} {
		a, err := newAnnotations(tt.prefix)
		if err != nil {
			t.Errorf("newAnnotations(%q): %v", tt.prefix, err)
			continue
		}
		if a.backendData != tt.backendData || a.nodePublicIPv6 != tt.nodePublicIPv6 {
			t.Errorf("newAnnotations(%q): %q, %q; want %q, %q", tt.prefix, a.backendData, a.nodePublicIPv6, tt.backendData, tt.nodePublicIPv6)
		}
	}
	for _, tt := range []struct{ prefix, want string }{
		{"a/b/c", "at most one '/'"},
		{"example.com/flannel/", "at most one '/'"},
		{"Bad_Prefix", "Kubernetes refuses"},
		{"-x.io", "Kubernetes refuses"},
		{"example.com/bad name", "Kubernetes refuses"},
		{"example.com/_x", "Kubernetes refuses"},
		{"/flannel", "Kubernetes refuses"},
		{"example.com/" + strings.Repeat("x", 45), "Kubernetes refuses"}, // a name part over 63 characters
	} {
		_, err := newAnnotations(tt.prefix)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("newAnnotations(%q): %v, want an error saying %q", tt.prefix, err, tt.want)
		}
	}
}

// TestWireGuardAndHostGWAnnotations writes the annotations of a wireguard,
// a host-gw, an ipip and an extension node as flanneld writes them, and
// reads them back.
func TestWireGuardAndHostGWAnnotations(t *testing.T) {
	a, err := newAnnotations(DefaultAnnotationPrefix)
	if err != nil {
		t.Fatal(err)
	}
	dual := mustConfig(t, `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"wireguard"}}`)
	const key = "hBxRKTKWx1m2Q7V5rHeRbg0hJ3o4I3eAq6bqg0Q3HkA="
	tests := []struct {
		name  string
		attrs subnet.LeaseAttrs
		want  map[string]string
	}{
		{"wireguard", subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.77.1"), PublicIPv6: netip.MustParseAddr("fd77::1"),
			BackendType: "wireguard", WireGuard: &subnet.WireGuardData{PublicKey: key, Port: 51820},
			WireGuardV6: &subnet.WireGuardData{PublicKey: key, Port: 51821}}, map[string]string{
			p + "backend-type":    "wireguard",
			p + "backend-data":    `{"PublicKey":"` + key + `","Port":51820}`,
			p + "backend-v6-data": `{"PublicKey":"` + key + `","Port":51821}`,
		}},
		{"host-gw", subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.77.1"), PublicIPv6: netip.MustParseAddr("fd77::1"),
			BackendType: "host-gw"}, map[string]string{
			p + "backend-type":    "host-gw",
			p + "backend-data":    "null",
			p + "backend-v6-data": "null",
		}},
		{"ipip", subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.77.1"), PublicIPv6: netip.MustParseAddr("fd77::1"),
			BackendType: "ipip"}, map[string]string{
			p + "backend-type": "ipip",
			p + "backend-data": "null",
		}},
		{"extension", subnet.LeaseAttrs{PublicIP: netip.MustParseAddr("192.168.77.1"), PublicIPv6: netip.MustParseAddr("fd77::1"),
			BackendType: "extension", ExtensionData: `"4e:fb:7d:bf:6b:2d"`}, map[string]string{
			p + "backend-type":    "extension",
			p + "backend-data":    `"4e:fb:7d:bf:6b:2d"`,
			p + "backend-v6-data": "null",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ann, err := a.leaseAnnotations(dual, tc.attrs)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.want {
				if ann[k] != v {
					t.Errorf("%s = %q, want %q", k, ann[k], v)
				}
			}
			l, err := a.nodeLease(dual, testNode(ann, "10.244.5.0/24", "fd00:10:244:5::/64"))
			if err != nil {
				t.Fatal(err)
			}
			if !sameWG(l.Attrs.WireGuard, tc.attrs.WireGuard) || !sameWG(l.Attrs.WireGuardV6, tc.attrs.WireGuardV6) ||
				l.Attrs.BackendType != tc.attrs.BackendType || l.Attrs.PublicIPv6 != tc.attrs.PublicIPv6 ||
				l.Attrs.ExtensionData != tc.attrs.ExtensionData {
				t.Errorf("read back %+v", l.Attrs)
			}
		})
	}
}
