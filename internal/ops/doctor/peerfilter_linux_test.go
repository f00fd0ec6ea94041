package doctor

import (
	"context"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/weft-net/weft/internal/ops/connectivity"
	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
)

// peerFilterRuleset is table inet weft-vxlan as the vxlan backend writes
// it, admitting the IPv4 addresses elems.
func peerFilterRuleset(elems string) string {
	set := "set peers { type ipv4_addr; }"
	if elems != "" {
		set = "set peers { type ipv4_addr; elements = { " + elems + " } }"
	}
	return `table inet weft-vxlan {
	` + set + `
	set peers-v6 { type ipv6_addr; }
	chain input {
		type filter hook input priority filter; policy accept;
		meta nfproto ipv4 udp dport 8472 ip saddr @peers accept comment "weft: vxlan from a peer"
		meta nfproto ipv6 udp dport 8472 ip6 saddr @peers-v6 accept comment "weft: vxlan from a peer"
		udp dport 8472 counter drop comment "weft: vxlan from a non-peer"
	}
}`
}

// TestCheckPeerFilter: on a weft kernel VXLAN node, firewall/vxlan-peers
// says whether table inet weft-vxlan is there and admits every peer, and
// names the rule that drops the others; firewall/input does not report
// weft's own drop as a firewall closing the port; on a node without a
// weft VXLAN device, a table left behind is reported.
func TestCheckPeerFilter(t *testing.T) {
	vx := &inspect.Kernel{Device: inspect.Device{Name: "weft.1", Kind: inspect.KindVXLAN}}
	for _, tt := range []struct {
		name, ruleset string
		k             *inspect.Kernel
		status        Status
		want          string
	}{
		{"no table", "", vx, Warn, `table inet weft-vxlan is missing: the VXLAN port accepts datagrams from any host`},
		{"every peer", peerFilterRuleset("192.168.77.2, 192.168.77.9"), vx, OK,
			`admits VXLAN datagrams from the 2 peer addresses only; dropped so far: 0 by rule "weft: vxlan from a non-peer"`},
		{"a peer missing", peerFilterRuleset("192.168.77.2"), vx, Fail, `does not admit peers 192.168.77.9: .* rule "weft: vxlan from a non-peer"`},
		{"left on a TAP node", peerFilterRuleset(""), &inspect.Kernel{Device: inspect.Device{Name: "weft.1", Kind: inspect.KindTAP}}, Warn, `is left from a kernel VXLAN node`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ns := nettest.NewNS(t, "doctorpf")
			if tt.ruleset != "" {
				cmd := ns.Command(context.Background(), "nft", "-f", "-")
				cmd.Stdin = strings.NewReader(tt.ruleset)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("nft -f: %v\n%s", err, out)
				}
			}
			var leases []subnet.Lease
			for _, n := range []byte{1, 2, 9} {
				leases = append(leases, subnet.Lease{Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, n, 0}), 24),
					Attrs: subnet.LeaseAttrs{PublicIP: netip.AddrFrom4([4]byte{192, 168, 77, n}), BackendType: subnet.BackendTypeVXLAN}})
			}
			self := &leases[0]
			s := &state{Node: Node{Do: connectivity.Do(ns.Do), Leases: leases,
				Config: &subnet.Config{Backend: subnet.BackendConfig{Type: subnet.BackendTypeVXLAN, Port: 8472}}},
				r: &Report{}, self: self, k: tt.k, fp: &fastPathRead{}}
			checkPeerFilter(s)
			if len(s.r.Checks) != 1 || s.r.Checks[0].Status != tt.status || !regexp.MustCompile(tt.want).MatchString(s.r.Checks[0].Evidence) {
				t.Fatalf("got %+v, want %s with %q", s.r.Checks, tt.status, tt.want)
			}
			if tt.ruleset != "" {
				if rules, err := s.portRules(8472); err != nil || len(rules) != 0 {
					t.Fatalf("portRules lists weft's own filter as a rule on the port: %+v, %v", rules, err)
				}
			}
		})
	}
}
