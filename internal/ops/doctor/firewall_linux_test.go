package doctor

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/weft-net/weft/internal/ops/connectivity"
	"github.com/weft-net/weft/internal/ops/inspect"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
)

func TestAcceptsNetwork(t *testing.T) {
	network := netip.MustParsePrefix("10.244.0.0/16")
	// rule is what iptables-nft writes for -s <data>/<mask> -j <v>: a
	// 4-byte load, a mask, a compare.
	rule := func(data []byte, v expr.VerdictKind) *nftables.Rule {
		return &nftables.Rule{Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 255, 0, 0}, Xor: []byte{0, 0, 0, 0}},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data},
			&expr.Verdict{Kind: v},
		}}
	}
	// nftRule is what nft writes for ip saddr <prefix>: only the leading
	// bytes, masked when the length is not a multiple of 8.
	nftRule := func(data, mask []byte) *nftables.Rule {
		exprs := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: uint32(len(data))}}
		if mask != nil {
			exprs = append(exprs, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(len(data)), Mask: mask, Xor: make([]byte, len(data))})
		}
		exprs = append(exprs, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data}, &expr.Verdict{Kind: expr.VerdictAccept})
		return &nftables.Rule{Exprs: exprs}
	}
	tests := []struct {
		name  string
		rules []*nftables.Rule
		want  bool
	}{
		{"accepts the network", []*nftables.Rule{rule([]byte{172, 17, 0, 0}, expr.VerdictAccept), rule([]byte{10, 244, 0, 0}, expr.VerdictAccept)}, true},
		{"nft ip saddr 10.244.0.0/16", []*nftables.Rule{nftRule([]byte{10, 244}, nil)}, true},
		{"nft ip saddr 10.0.0.0/8 covers it", []*nftables.Rule{nftRule([]byte{10}, nil)}, true},
		{"nft ip saddr 10.240.0.0/12 covers it", []*nftables.Rule{nftRule([]byte{10, 240}, []byte{0xff, 0xf0})}, true},
		{"nft ip saddr 10.244.0.0/24 is narrower", []*nftables.Rule{nftRule([]byte{10, 244, 0}, nil)}, false},
		{"nft ip saddr 10.245.0.0/16", []*nftables.Rule{nftRule([]byte{10, 245}, nil)}, false},
		{"another network", []*nftables.Rule{rule([]byte{172, 17, 0, 0}, expr.VerdictAccept)}, false},
		{"drops the network", []*nftables.Rule{rule([]byte{10, 244, 0, 0}, expr.VerdictDrop)}, false},
		{"no rules", nil, false},
	}
	for _, tt := range tests {
		if got := acceptsNetwork(tt.rules, network); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestJumpTargets(t *testing.T) {
	jump := &nftables.Rule{Exprs: []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictJump, Chain: "WEFT-FWD"}}}
	conditional := &nftables.Rule{Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte("cni0\x00")},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: "OTHER"},
	}}
	accept := &nftables.Rule{Exprs: []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept}}}
	if got := jumpTargets([]*nftables.Rule{conditional, jump, accept}); len(got) != 1 || got[0] != "WEFT-FWD" {
		t.Errorf("jumpTargets = %q, want [WEFT-FWD]", got)
	}
}

func TestPortRule(t *testing.T) {
	udp := []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{17}}}
	tcp := []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{6}}}
	dport := func(p byte) []expr.Any {
		return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x21, p}}}
	}
	rule := func(v expr.VerdictKind, parts ...[]expr.Any) *nftables.Rule {
		var exprs []expr.Any
		for _, p := range parts {
			exprs = append(exprs, p...)
		}
		return &nftables.Rule{Exprs: append(exprs, &expr.Counter{}, &expr.Verdict{Kind: v})}
	}
	ct := []expr.Any{&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{6, 0, 0, 0}, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}}}
	ctState := func(mask byte) []expr.Any {
		return []expr.Any{&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binary.NativeEndian.AppendUint32(nil, uint32(mask)), Xor: []byte{0, 0, 0, 0}},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}}}
	}
	ctNew, ctUntracked := ctState(8|64), ctState(64)
	saddr := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{1, 2, 3, 4}}}
	iif := []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte("eth0\x00")}}
	// nfproto is what nft writes in an inet table before an ip or ip6
	// payload match (and for meta nfproto): NFPROTO_IPV4 2, NFPROTO_IPV6 10.
	nfproto := func(op expr.CmpOp, fam byte) []expr.Any {
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: []byte{fam}}}
	}
	ipv4, ipv6 := nfproto(expr.CmpOpEq, 2), nfproto(expr.CmpOpEq, 10)
	etherIPv6 := []expr.Any{&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x86, 0xdd}}}
	// src is nft's ip saddr <prefix> (the leading bytes, masked when the
	// length is not a multiple of 8) or iptables-nft's -s (all 4 bytes
	// under a mask); off is 12 for IPv4, 8 for IPv6.
	src := func(off uint32, op expr.CmpOp, data, mask []byte) []expr.Any {
		out := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: uint32(len(data))}}
		if mask != nil {
			out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(len(data)), Mask: mask, Xor: make([]byte, len(data))})
		}
		return append(out, &expr.Cmp{Op: op, Register: 1, Data: data})
	}
	nexthdrUDP := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 6, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{17}}}
	for _, tt := range []struct {
		name string
		r    *nftables.Rule
		v6   bool // the datagrams evaluated are IPv6
		want string
		from string // the source prefix an accept is limited to
	}{
		{"udp dport 8472 accept", rule(expr.VerdictAccept, udp, dport(0x18)), false, "accept", ""},
		{"udp dport 8472 drop", rule(expr.VerdictDrop, udp, dport(0x18)), false, "drop", ""},
		{"udp dport 8473 accept", rule(expr.VerdictAccept, udp, dport(0x19)), false, "", ""},
		{"tcp dport 8472 accept", rule(expr.VerdictAccept, tcp, dport(0x18)), false, "", ""},
		{"ct state established accept", rule(expr.VerdictAccept, ct), false, "", ""},
		{"ip saddr 1.2.3.4 udp dport 8472 accept", rule(expr.VerdictAccept, saddr, udp, dport(0x18)), false, "accept", "1.2.3.4/32"},
		{"iifname eth0 udp dport 8472 accept", rule(expr.VerdictAccept, iif, udp, dport(0x18)), false, "", ""},
		{"ip saddr 1.2.3.4 udp dport 8472 drop", rule(expr.VerdictDrop, saddr, udp, dport(0x18)), false, "", ""},
		{"udp dport 8472 ct state new,untracked accept", rule(expr.VerdictAccept, udp, dport(0x18), ctNew), false, "accept", ""},
		{"udp dport 8472 ct state untracked accept", rule(expr.VerdictAccept, udp, dport(0x18), ctUntracked), false, "", ""},
		{"ct state established udp dport 8472 accept", rule(expr.VerdictAccept, ct, udp, dport(0x18)), false, "", ""},
		{"accept", rule(expr.VerdictAccept), false, "accept", ""},
		{"drop", rule(expr.VerdictDrop), false, "drop", ""},
		// Sources.
		{"nft ip saddr 192.168.77.0/24 udp dport 8472 accept", rule(expr.VerdictAccept, ipv4, src(12, expr.CmpOpEq, []byte{192, 168, 77}, nil), udp, dport(0x18)), false, "accept", "192.168.77.0/24"},
		{"nft ip saddr 192.168.64.0/20 accept (no port)", rule(expr.VerdictAccept, src(12, expr.CmpOpEq, []byte{192, 168, 64}, []byte{255, 255, 240}), udp), false, "accept", "192.168.64.0/20"},
		{"iptables -s 192.168.64.0/20 -p udp --dport 8472 -j ACCEPT", rule(expr.VerdictAccept, src(12, expr.CmpOpEq, []byte{192, 168, 64, 0}, []byte{255, 255, 240, 0}), udp, dport(0x18)), false, "accept", "192.168.64.0/20"},
		{"ip saddr != 1.2.3.4 udp dport 8472 accept", rule(expr.VerdictAccept, src(12, expr.CmpOpNeq, []byte{1, 2, 3, 4}, nil), udp, dport(0x18)), false, "", ""},
		{"ip saddr 1.2.3.4 iifname eth0 udp dport 8472 accept", rule(expr.VerdictAccept, saddr, iif, udp, dport(0x18)), false, "", ""},
		{"ip6 saddr fd77::/64 udp dport 8472 accept, IPv6", rule(expr.VerdictAccept, ipv6, src(8, expr.CmpOpEq, []byte{0xfd, 0x77, 0, 0, 0, 0, 0, 0}, nil), udp, dport(0x18)), true, "accept", "fd77::/64"},
		{"ip6 saddr fd77::/64 udp dport 8472 accept, IPv4", rule(expr.VerdictAccept, ipv6, src(8, expr.CmpOpEq, []byte{0xfd, 0x77, 0, 0, 0, 0, 0, 0}, nil), udp, dport(0x18)), false, "", ""},
		// Families.
		{"meta nfproto ipv6 udp dport 8472 drop, IPv4", rule(expr.VerdictDrop, ipv6, udp, dport(0x18)), false, "", ""},
		{"meta nfproto ipv6 udp dport 8472 drop, IPv6", rule(expr.VerdictDrop, ipv6, udp, dport(0x18)), true, "drop", ""},
		{"meta nfproto ipv4 udp dport 8472 drop, IPv6", rule(expr.VerdictDrop, ipv4, udp, dport(0x18)), true, "", ""},
		{"meta nfproto != ipv4 drop, IPv4", rule(expr.VerdictDrop, nfproto(expr.CmpOpNeq, 2)), false, "", ""},
		{"meta nfproto != ipv4 drop, IPv6", rule(expr.VerdictDrop, nfproto(expr.CmpOpNeq, 2)), true, "drop", ""},
		{"meta protocol ip6 udp dport 8472 drop, IPv4", rule(expr.VerdictDrop, etherIPv6, udp, dport(0x18)), false, "", ""},
		{"ip6 nexthdr udp udp dport 8472 accept, IPv6", rule(expr.VerdictAccept, ipv6, nexthdrUDP, dport(0x18)), true, "accept", ""},
		// A family compared by order may leave out the evaluated one.
		{"meta nfproto > ipv4 drop, IPv6", rule(expr.VerdictDrop, nfproto(expr.CmpOpGt, 2)), true, "", ""},
		{"meta nfproto < ipv6 udp dport 8472 accept, IPv6", rule(expr.VerdictAccept, nfproto(expr.CmpOpLt, 10), udp, dport(0x18)), true, "", ""},
		{"meta nfproto != ipv4 udp dport 8472 accept, IPv6", rule(expr.VerdictAccept, nfproto(expr.CmpOpNeq, 2), udp, dport(0x18)), true, "accept", ""},
	} {
		got, from := matchRule(tt.r, tt.v6, 8472).decides()
		wantFrom := netip.Prefix{}
		if tt.from != "" {
			wantFrom = netip.MustParsePrefix(tt.from)
		}
		if got != tt.want || from != wantFrom {
			t.Errorf("%s: %q from %v, want %q from %v", tt.name, got, from, tt.want, wantFrom)
		}
	}
}

// TestCheckInput loads input rulesets into a test namespace and checks
// what firewall/input says of UDP 8472: firewalld's layout (the public
// zone for eth0 reached by a per-interface goto, the drop zone as the
// default, a final reject) with and without the port opened in public, a
// policy drop with the port accepted from every peer or from one source
// only, and a rule dropping the port; on uvxlan with the fast path's
// ingress program attached, a drop is a warning naming the fast path.
func TestCheckInput(t *testing.T) {
	firewalld := func(allow string) string {
		return `table inet firewalld {
	chain filter_INPUT {
		type filter hook input priority filter + 10; policy accept;
		ct state established,related accept
		iifname "lo" accept
		jump filter_INPUT_ZONES
		ct state invalid drop
		reject with icmpx admin-prohibited
	}
	chain filter_INPUT_ZONES {
		iifname "eth0" goto filter_IN_public
		goto filter_IN_drop
	}
	chain filter_IN_drop {
		drop
	}
	chain filter_IN_public {
		jump filter_IN_public_allow
		meta l4proto { icmp, ipv6-icmp } accept
	}
	chain filter_IN_public_allow {
		tcp dport 22 accept
		` + allow + `
	}
}`
	}
	const dropPort = "table inet f { chain in { type filter hook input priority 0; udp dport 8472 counter drop\n}\n}"
	for _, tt := range []struct {
		name, ruleset string
		status        Status
		want          string
		backend       string
		fastPath      inspect.FastPath // what fastPath reads on the node
	}{
		{"firewalld, port open", firewalld("udp dport 8472 ct state new,untracked accept"), OK, "no input chain drops UDP 8472", "", inspect.FastPath{}},
		{"firewalld, port closed", firewalld(""), Fail, `table inet firewalld chain filter_INPUT drops UDP 8472 \(VXLAN, every VXLAN datagram from the peers\) by rule "drop, matching every packet \(handle \d+\) in chain filter_IN_drop"`, "", inspect.FastPath{}},
		{"policy drop", "table ip filter { chain INPUT { type filter hook input priority 0; policy drop; ct state established accept\n}\n}", Fail,
			"table ip filter chain INPUT has policy drop and no rule accepting UDP 8472", "", inspect.FastPath{}},
		{"policy drop, port accepted", "table ip filter { chain INPUT { type filter hook input priority 0; policy drop; counter udp dport 8472 accept\n}\n}", OK, "no input chain", "", inspect.FastPath{}},
		{"policy drop, port accepted from one source", "table ip filter { chain INPUT { type filter hook input priority 0; policy drop; ip saddr 1.2.3.4 udp dport 8472 accept\n}\n}", Fail,
			"table ip filter chain INPUT has policy drop and no rule accepting UDP 8472 from every peer", "", inspect.FastPath{}},
		{"rule drops the port", dropPort, Fail, `table inet f chain in drops UDP 8472 .* by rule "udp dport 8472 drop \(handle \d+\)"`, "", inspect.FastPath{}},
		{"uvxlan config, no fast path ingress, rule drops the port", dropPort, Fail, `table inet f chain in drops UDP 8472 \(VXLAN, every VXLAN datagram from the peers\) by rule "udp dport 8472 drop \(handle \d+\)"$`,
			subnet.BackendTypeUVXLAN, inspect.FastPath{Egress: true}},
		{"fast path, rule drops the port", dropPort, Warn, `table inet f chain in drops UDP 8472 \(VXLAN, the datagrams of peers on the userspace path\) by rule "udp dport 8472 drop \(handle \d+\)"; ` +
			`the fast path \(weft_fp_ingress on the underlay's ingress\) takes the datagrams of the peers it carries before this hook`, "", inspect.FastPath{Egress: true, Ingress: true}},
		{"fast path, policy drop", "table ip filter { chain INPUT { type filter hook input priority 0; policy drop; ct state established accept\n}\n}", Warn,
			"table ip filter chain INPUT has policy drop and no rule accepting UDP 8472 from every peer: the VXLAN datagrams of peers on the userspace path that no rule accepts are dropped there, whatever other tables accept; the fast path",
			"", inspect.FastPath{Egress: true, Ingress: true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			runInput(t, tt.ruleset, subnet.BackendConfig{Type: tt.backend}, tt.fastPath, "v4", tt.status, tt.want, "")
		})
	}
}

// TestCheckInputFamilies loads input rulesets into a test namespace and
// checks what firewall/input says of UDP 8472 on nodes whose underlay is
// IPv4, IPv6 or both (by their leases): an ip6 table counts for IPv6 only,
// an ip table for IPv4 only, an inet rule limited to one family (meta
// nfproto) for that family only; and accepts limited to sources open the
// port when they hold every peer's underlay address, else the report names
// the peers left out and the fix accepts them.
func TestCheckInputFamilies(t *testing.T) {
	const (
		ip6Drop   = "table ip6 f { chain in { type filter hook input priority 0; udp dport 8472 drop\n}\n}"
		inetDrop  = "table inet f { chain in { type filter hook input priority 0; udp dport 8472 drop\n}\n}"
		inetDrop6 = "table inet f { chain in { type filter hook input priority 0; meta nfproto ipv6 udp dport 8472 drop\n}\n}"
		inetDrop4 = "table inet f { chain in { type filter hook input priority 0; ip protocol udp udp dport 8472 drop\n}\n}"
	)
	policyDrop := func(fam string, rules ...string) string {
		return "table " + fam + " filter { chain INPUT { type filter hook input priority 0; policy drop; ct state established accept\n" + strings.Join(rules, "\n") + "\n}\n}"
	}
	dropAfter := func(rule string) string {
		return "table inet f { chain in { type filter hook input priority 0; " + rule + "\nudp dport 8472 counter drop\n}\n}"
	}
	jumpFor := func(family, policy, rule string) string { // an inet chain that jumps to sub for one family
		return "table inet f { chain in { type filter hook input priority 0; " + policy + " meta nfproto " + family + " jump sub\n}\nchain sub { " + rule + "\n}\n}"
	}
	for _, tt := range []struct {
		name, ruleset, underlay string // underlay: v4, v6 or dual (see inputNode)
		status                  Status
		want, fix               string
	}{
		{"ip6 table drops the port, IPv6 underlay", ip6Drop, "v6", Fail, `^table ip6 f chain in drops UDP 8472 over IPv6 \(VXLAN, every VXLAN datagram from the peers\) by rule "udp dport 8472 drop \(handle \d+\)"$`, "nft insert rule ip6 f in udp dport 8472 accept"},
		{"ip6 table drops the port, IPv4 underlay", ip6Drop, "v4", OK, `^no input chain drops UDP 8472 \(VXLAN\)$`, ""},
		{"ip table policy drop, IPv6 underlay", policyDrop("ip"), "v6", OK, `^no input chain drops UDP 8472 \(VXLAN\) over IPv6$`, ""},
		{"inet rule drops IPv6 only, IPv4 underlay", inetDrop6, "v4", OK, "no input chain drops UDP 8472", ""},
		{"inet rule drops IPv6 only, dual stack", inetDrop6, "dual", Fail, `^table inet f chain in drops UDP 8472 over IPv6 \(`, ""},
		{"inet rule drops IPv4 only, IPv6 underlay", inetDrop4, "v6", OK, "no input chain drops UDP 8472", ""},
		{"inet rule drops IPv4 only, dual stack", inetDrop4, "dual", Fail, `^table inet f chain in drops UDP 8472 over IPv4 \(`, ""},
		{"inet rule drops the port, dual stack", inetDrop, "dual", Fail, `^table inet f chain in drops UDP 8472 over IPv4 and IPv6 \(`, ""},
		{"ip6tables-nft policy drop, IPv6 underlay", policyDrop("ip6"), "v6", Fail, `^table ip6 filter chain INPUT has policy drop and no rule accepting UDP 8472 over IPv6 from every peer:`, `^ip6tables -I INPUT -p udp --dport 8472 -j ACCEPT$`},
		{"inet jump for IPv4 only to a chain that drops, dual stack", jumpFor("ipv4", "", "udp dport 8472 drop"), "dual", Fail,
			`^table inet f chain in drops UDP 8472 over IPv4 \(.*by rule "udp dport 8472 drop \(handle \d+\) in chain sub"$`, ""},
		{"inet jump for IPv6 only to a chain that accepts, IPv4 underlay", jumpFor("ipv6", "policy drop;", "udp dport 8472 accept"), "v4", Fail,
			`^table inet f chain in has policy drop and no rule accepting UDP 8472 from every peer:`, ""},
		{"inet jump for IPv6 only to a chain that accepts, IPv6 underlay", jumpFor("ipv6", "policy drop;", "udp dport 8472 accept"), "v6", OK, "no input chain drops UDP 8472", ""},
		// Accepts limited to sources.
		{"policy drop, a source prefix holds every peer", policyDrop("ip", "ip saddr 192.168.77.0/24 udp dport 8472 accept"), "v4", OK,
			`^no input chain drops UDP 8472 \(VXLAN\); rules accept it from sources that hold every peer's public address \(a peer whose --public-ip is not its underlay address sends from`, ""},
		{"policy drop, two sources hold every peer", policyDrop("ip", "ip saddr 192.168.77.2 udp dport 8472 accept", "ip saddr 192.168.77.9 accept"), "v4", OK, "no input chain drops UDP 8472", ""},
		{"policy drop, sources leave out a peer", policyDrop("ip", "ip saddr 192.168.77.0/29 udp dport 8472 accept"), "v4", Fail,
			`^table ip filter chain INPUT has policy drop and no rule accepting UDP 8472 from every peer \(rules accept it only from sources that leave out peer 192\.168\.77\.9 \(10\.244\.9\.0/24\); judged by the peers' public addresses\): `,
			`^iptables -I INPUT -s 192\.168\.77\.9 -p udp --dport 8472 -j ACCEPT$`},
		{"ip6 policy drop, a source prefix holds every peer", policyDrop("ip6", "ip6 saddr fd77::/64 udp dport 8472 accept"), "v6", OK, "no input chain drops UDP 8472", ""},
		{"ip6 policy drop, sources leave out every peer", policyDrop("ip6", "ip6 saddr fd78::/64 udp dport 8472 accept"), "v6", Fail,
			`leave out peers fd77::2 \(fd00:10:244:2::/64\), fd77::9 \(fd00:10:244:9::/64\);`, `^ip6tables -I INPUT -s fd77::2,fd77::9 -p udp`},
		{"drop after sources that hold every peer", dropAfter("ip saddr 192.168.77.0/24 udp dport 8472 accept"), "v4", OK, "no input chain drops UDP 8472", ""},
		{"drop after sources that leave out a peer", dropAfter("ip saddr 192.168.77.2 udp dport 8472 accept"), "v4", Fail,
			`^table inet f chain in drops UDP 8472 \(VXLAN, every VXLAN datagram from peer 192\.168\.77\.9 \(10\.244\.9\.0/24\)\) by rule "udp dport 8472 drop \(handle \d+\)" \(rules before it accept UDP 8472 only from sources that leave them out; judged by the peers' public addresses\)$`,
			`^delete that rule, or nft insert rule inet f in ip saddr \{ 192\.168\.77\.9 \} udp dport 8472 accept$`},
		{"dual stack, IPv4 sources hold every IPv4 peer", dropAfter("ip saddr 192.168.77.0/24 udp dport 8472 accept"), "dual", Fail,
			`^table inet f chain in drops UDP 8472 over IPv6 .*by rule "udp dport 8472 drop \(handle \d+\)"$`, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			runInput(t, tt.ruleset, subnet.BackendConfig{}, inspect.FastPath{}, tt.underlay, tt.status, tt.want, tt.fix)
		})
	}
}

// TestCheckInputJumps checks what firewall/input makes of chains reached
// by a jump or goto with a match of its own: accepts limited to sources in
// a chain reached through an interface match decide nothing (the peers
// may arrive on another interface); a chain reached through a source
// prefix (firewalld's source zones) accepts only from that prefix, also
// when it accepts everything or a wider prefix, and its drop drops the
// peers of that prefix that no rule accepted before; a jump for another
// protocol is not followed, one for the port alone is unconditional.
func TestCheckInputJumps(t *testing.T) {
	// table is an inet table with chain in on the input hook (its policy
	// and rules in in) and a chain sub.
	table := func(in, sub string) string {
		return "table inet f { chain in { type filter hook input priority 0; " + in + "\n}\nchain sub { " + sub + "\n}\n}"
	}
	const (
		leftOut9 = `^table inet f chain in has policy drop and no rule accepting UDP 8472 from every peer \(rules accept it only from sources that leave out peer 192\.168\.77\.9 \(10\.244\.9\.0/24\);`
		leftOut2 = `^table inet f chain in has policy drop and no rule accepting UDP 8472 from every peer \(rules accept it only from sources that leave out peer 192\.168\.77\.2 \(10\.244\.2\.0/24\);`
	)
	for _, tt := range []struct {
		name, ruleset string
		status        Status
		want, fix     string
	}{
		{"interface jump to accepts by source, then a drop", table(`iifname "eth1" jump sub`+"\nudp dport 8472 drop", "ip saddr 192.168.77.0/24 udp dport 8472 accept"), Fail,
			`^table inet f chain in drops UDP 8472 \(VXLAN, every VXLAN datagram from the peers\) by rule "udp dport 8472 drop \(handle \d+\)"$`, ""},
		{"interface jump to an accept of the port", table(`policy drop; iifname "eth0" jump sub`, "udp dport 8472 accept"), OK, "^no input chain drops UDP 8472", ""},
		{"source zone holding every peer", table("policy drop; ip saddr 192.168.77.0/24 goto sub", "accept"), OK, "^no input chain drops UDP 8472", ""},
		{"source zone leaving out a peer", table("policy drop; ip saddr 192.168.77.0/29 goto sub", "accept"), Fail, leftOut9, ""},
		{"source zone accepting a wider prefix", table("policy drop; ip saddr 192.168.77.0/29 jump sub", "ip saddr 192.168.77.0/24 udp dport 8472 accept"), Fail, leftOut9, ""},
		{"source zones holding every peer together", table("policy drop; ip saddr 192.168.77.0/29 jump sub\nip saddr 192.168.77.8/29 jump sub", "udp dport 8472 accept"), OK, "^no input chain drops UDP 8472", ""},
		{"source zone that drops, then an accept", table("ip saddr 192.168.77.0/29 jump sub\nudp dport 8472 accept\ndrop", "udp dport 8472 drop"), Fail,
			`^table inet f chain in drops UDP 8472 \(VXLAN, every VXLAN datagram from peer 192\.168\.77\.2 \(10\.244\.2\.0/24\)\) by rule "udp dport 8472 drop \(handle \d+\) in chain sub" \(a rule limited to sources that hold them leads there; judged by the peers' public addresses\)$`,
			`^delete that rule, or nft insert rule inet f in ip saddr \{ 192\.168\.77\.2 \} udp dport 8472 accept$`},
		{"source zone that drops peers already accepted", table("ip saddr 192.168.77.0/29 accept\nip saddr 192.168.77.0/29 jump sub", "drop"), OK, "^no input chain drops UDP 8472", ""},
		{"jump for other sources to an accept", table("policy drop; ip saddr != 192.168.77.0/29 jump sub", "udp dport 8472 accept"), Fail, leftOut2, ""},
		{"jump for other sources on an interface to an accept", table(`policy drop; ip saddr != 192.168.77.0/29 iifname "eth0" jump sub`, "accept"), Fail, leftOut2, ""},
		{"jump by mark to an accept", table("policy drop; meta mark 1 jump sub", "udp dport 8472 accept"), Warn,
			`^table inet f chain in: cannot tell whether it lets UDP 8472 \(VXLAN\) through: rule \(handle \d+\) in chain sub accepts it in a chain reached through a match doctor cannot evaluate`, ""},
		{"jump for TCP to an accept", table("policy drop; tcp dport 22 jump sub", "accept"), Fail, `^table inet f chain in has policy drop and no rule accepting UDP 8472 from every peer: `, ""},
		{"jump for the port to a drop", table("udp dport 8472 jump sub\naccept", "drop"), Fail, `^table inet f chain in drops UDP 8472 .* by rule "drop, matching every packet \(handle \d+\) in chain sub"$`, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			runInput(t, tt.ruleset, subnet.BackendConfig{}, inspect.FastPath{}, "v4", tt.status, tt.want, tt.fix)
		})
	}
}

// TestCheckInputLeaving checks what firewall/input makes of rules that
// send datagrams out of a chain before its end: a return ends the chain
// for the datagrams it matches (all of them, those of a source prefix, or
// all but those of one); a goto ends the calling chain for its datagrams,
// so that rules after it do not accept them; after one whose match doctor
// cannot evaluate, an accept or (after a return) a drop is a doubt (a
// warning), neither an ok nor a failure. A verdict map is a doubt too.
func TestCheckInputLeaving(t *testing.T) {
	table := func(in, sub string) string {
		return "table inet f { chain in { type filter hook input priority 0; " + in + "\n}\nchain sub { " + sub + "\n}\n}"
	}
	const (
		policyFail = `^table inet f chain in has policy drop and no rule accepting UDP 8472 from every peer`
		leftOut2   = policyFail + ` \(rules accept it only from sources that leave out peer 192\.168\.77\.2 \(10\.244\.2\.0/24\);`
		leftOut9   = policyFail + ` \(rules accept it only from sources that leave out peer 192\.168\.77\.9 \(10\.244\.9\.0/24\);`
	)
	for _, tt := range []struct {
		name, ruleset string
		status        Status
		want          string
	}{
		{"return before an accept", table("policy drop; jump sub", "return\nudp dport 8472 accept"), Fail, policyFail + ": "},
		{"return of other sources before an accept", table("policy drop; jump sub", "ip saddr != 192.168.77.0/29 return\nudp dport 8472 accept"), Fail, leftOut9},
		{"return of a source before an accept", table("policy drop; jump sub", "ip saddr 192.168.77.0/29 return\nudp dport 8472 accept"), Fail, leftOut2},
		{"return of other sources holding every peer", table("policy drop; jump sub", "ip saddr != 192.168.77.0/24 return\nudp dport 8472 accept"), OK, "^no input chain drops UDP 8472"},
		{"return by mark before an accept", table("policy drop; jump sub", "meta mark 1 return\nudp dport 8472 accept"), Warn, `^table inet f chain in: cannot tell whether it lets UDP 8472 \(VXLAN\) through: rule \(handle \d+\) in chain sub accepts it after a return or goto by a match doctor cannot evaluate`},
		{"return by mark before a drop", table("jump sub\nudp dport 8472 accept", "meta mark 1 return\ndrop"), Warn,
			`^table inet f chain in: cannot tell whether it lets UDP 8472 \(VXLAN\) through: rule "drop, matching every packet \(handle \d+\)" in chain sub drops it after a return whose match doctor cannot evaluate$`},
		{"goto a source's chain before an accept", table("policy drop; ip saddr 192.168.77.0/29 goto sub\nudp dport 8472 accept", ""), Fail, leftOut2},
		{"goto before an accept", table("policy drop; goto sub\nudp dport 8472 accept", ""), Fail, policyFail + ": "},
		{"goto by mark before an accept", table("policy drop; meta mark 1 goto sub\nudp dport 8472 accept", ""), Warn, `^table inet f chain in: cannot tell whether it lets UDP 8472 \(VXLAN\) through: rule \(handle \d+\) in chain in accepts it after a return or goto by a match doctor cannot evaluate`},
		{"goto another interface's rejecting zone before an accept", table(`policy drop; iifname "virbr0" goto sub`+"\nudp dport 8472 accept\nreject", "reject"), Warn, `^table inet f chain in: cannot tell whether it lets UDP 8472 \(VXLAN\) through: rule \(handle \d+\) in chain in accepts it after a return or goto by a match doctor cannot evaluate`},
		{"jump for a source and an interface to an accept", table(`policy drop; ip saddr 192.168.77.0/29 iifname "eth0" jump sub`, "udp dport 8472 accept"), Fail, leftOut9},
		{"source zone to an interface zone", "table inet f { chain in { type filter hook input priority 0; policy drop; ip saddr 192.168.77.0/29 jump zone\n}\n" +
			`chain zone { iifname "eth0" jump allow` + "\n}\nchain allow { udp dport 8472 accept\n}\n}", Fail, leftOut9},
		{"interface zone to a source zone", "table inet f { chain in { type filter hook input priority 0; policy drop; " + `iifname "eth0" jump zone` + "\n}\n" +
			"chain zone { ip saddr 192.168.77.0/29 jump allow\n}\nchain allow { udp dport 8472 accept\n}\n}", Fail, leftOut9},
		{"verdict map", "table inet f { chain in { type filter hook input priority 0; udp dport vmap { 8472 : drop }\n}\n}", Warn,
			`^table inet f chain in: cannot tell whether it lets UDP 8472 \(VXLAN\) through: rule \(handle \d+\) in chain in decides by a verdict map, which doctor does not evaluate$`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			runInput(t, tt.ruleset, subnet.BackendConfig{}, inspect.FastPath{}, "v4", tt.status, tt.want, "")
		})
	}
}

// TestCheckInputMaps checks NixOS's nftables firewall: a ct state
// verdict map whose new entry jumps to the chain of allowed ports, which
// accept them by an anonymous set of ports; the policy drop is a drop
// only when that chain does not accept the port (the overlay's first
// datagram of a flow is new). After a verdict map doctor does not
// evaluate, or a chain deeper than it walks, a drop and the policy are
// doubts, not drops.
func TestCheckInputMaps(t *testing.T) {
	nixos := func(allow string) string {
		return "table inet nixos-fw { chain input { type filter hook input priority 0; policy drop; iifname \"lo\" accept\n" +
			"ct state vmap { invalid : drop, established : accept, related : accept, new : jump input-allow, untracked : jump input-allow }\n" +
			"tcp flags syn / fin,syn,rst,ack log prefix \"refused connection: \" level info\n}\n" +
			"chain input-allow { icmp type echo-request accept\n" + allow + "\n}\n}"
	}
	const policyFail = `^table inet nixos-fw chain input has policy drop and no rule accepting UDP 8472 from every peer: `
	for _, tt := range []struct {
		name, ruleset string
		status        Status
		want          string
	}{
		{"NixOS accepting the port", nixos("tcp dport 22 accept\nudp dport { 8472, 51820 } accept"), OK, `^no input chain drops UDP 8472 \(VXLAN\)$`},
		{"NixOS accepting a range holding the port", nixos("udp dport { 53, 8000-9000 } accept"), OK, `^no input chain drops UDP 8472 \(VXLAN\)$`},
		{"NixOS accepting other ports", nixos("tcp dport 22 accept\nudp dport { 53, 51820 } accept\nudp dport 8000-8471 accept"), Fail, policyFail},
		{"verdict map by port, then the policy", "table inet f { chain in { type filter hook input priority 0; policy drop; udp dport vmap { 8472 : accept }\n}\n}", Warn,
			`^table inet f chain in: cannot tell whether it lets UDP 8472 \(VXLAN\) through: rule \(handle \d+\) in chain in decides by a verdict map`},
		{"chains too deep", "table inet f { chain in { type filter hook input priority 0; policy drop; jump c1\n}\n" +
			"chain c1 { jump c2\n}\nchain c2 { jump c3\n}\nchain c3 { jump c4\n}\nchain c4 { jump c5\n}\nchain c5 { jump c6\n}\nchain c6 { jump c7\n}\nchain c7 { accept\n}\n}", Warn,
			`^table inet f chain in: cannot tell whether it lets UDP 8472 \(VXLAN\) through: chain c7 is more than 6 jumps deep, past what doctor walks$`},
		{"verdict map by port, then a drop", "table inet f { chain in { type filter hook input priority 0; udp dport vmap { 8472 : accept }\ndrop\n}\n}", Warn,
			`^table inet f chain in: cannot tell whether it lets UDP 8472 \(VXLAN\) through: rule \(handle \d+\) in chain in decides by a verdict map`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			runInput(t, tt.ruleset, subnet.BackendConfig{}, inspect.FastPath{}, "v4", tt.status, tt.want, "")
		})
	}
}

// TestCheckInputNoPeers checks a node that knows no peer (a single-node
// cluster): an accept from everywhere but the sources that a goto took
// accepts (firewalld's source zone, then the public zone's accept); a
// drop limited to sources, and a drop or the policy after an accept from
// a source prefix, are doubts (warnings): which sources the peers will
// send from is not known.
func TestCheckInputNoPeers(t *testing.T) {
	table := func(in, sub string) string {
		return "table inet f { chain in { type filter hook input priority 0; " + in + "\n}\nchain sub { " + sub + "\n}\n}"
	}
	const doubt = `^table inet f chain in: cannot tell whether it lets UDP 8472 \(VXLAN\) through: `
	for _, tt := range []struct {
		name, ruleset string
		status        Status
		want          string
	}{
		{"firewalld's source zone, then the port accepted", table("policy drop; ip saddr 10.244.0.0/16 goto sub\nudp dport 8472 accept\nreject", "accept"), OK, `^no input chain drops UDP 8472 \(VXLAN\)$`},
		{"a return of a source, then a drop", table("jump sub\nudp dport 8472 accept", "ip saddr 192.168.77.0/24 return\ndrop"), Warn,
			doubt + `rule "drop, matching every packet \(handle \d+\)" in chain sub drops it from some sources, and this node knows no peer`},
		{"an accept from a source, then the policy", table("policy drop; ip saddr 192.168.77.0/24 udp dport 8472 accept", ""), Warn,
			doubt + `a rule accepts it from 192\.168\.77\.0/24 only, and this node knows no peer to tell whether they send from there, and the chain's policy drops the others$`},
		{"an accept from a source, then a drop", table("ip saddr 192.168.77.0/24 udp dport 8472 accept\nudp dport 8472 drop", ""), Warn,
			doubt + `a rule accepts it from 192\.168\.77\.0/24 only, .* and rule "udp dport 8472 drop \(handle \d+\)" in chain in drops the others$`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			runInput(t, tt.ruleset, subnet.BackendConfig{}, inspect.FastPath{}, "alone", tt.status, tt.want, "")
		})
	}
}

// TestCheckInputIptables loads iptables-nft rules into a test namespace:
// a REJECT target (an xtables target, not a native verdict) drops the
// port; ufw's not-local chain returns the datagrams (a return for local
// destinations by an xtables match) before its drop; after a return by an
// xtables match doctor cannot evaluate, the drop is a doubt, not a drop;
// a comment does not limit an accept.
func TestCheckInputIptables(t *testing.T) {
	// notLocal is ufw's not-local chain, by address type (typ: --dst-type
	// LOCAL as ufw has it), with the port accepted after it.
	notLocal := func(typ ...string) [][]string {
		return [][]string{{"-N", "not-local"}, append(append([]string{"-A", "not-local", "-m", "addrtype"}, typ...), "-j", "RETURN"),
			{"-A", "not-local", "-m", "addrtype", "--dst-type", "BROADCAST", "-j", "RETURN"}, {"-A", "not-local", "-j", "DROP"},
			{"-P", "INPUT", "DROP"}, {"-A", "INPUT", "-j", "not-local"}, {"-A", "INPUT", "-p", "udp", "--dport", "8472", "-j", "ACCEPT"}}
	}
	for _, tt := range []struct {
		name   string
		rules  [][]string
		status Status
		want   string
	}{
		{"reject", [][]string{{"-A", "INPUT", "-j", "REJECT", "--reject-with", "icmp-host-prohibited"}}, Fail,
			`^table ip filter chain INPUT drops UDP 8472 \(VXLAN, every VXLAN datagram from the peers\) by rule "drop, matching every packet \(handle \d+\)"$`},
		{"ufw's not-local", notLocal("--dst-type", "LOCAL"), OK, `^no input chain drops UDP 8472 \(VXLAN\)$`},
		{"a return by source address type, then a drop", notLocal("--src-type", "LOCAL"), Warn,
			`^table ip filter chain INPUT: cannot tell whether it lets UDP 8472 \(VXLAN\) through: rule "drop, matching every packet \(handle \d+\)" in chain not-local drops it after a return`},
		{"RHEL's accept of new datagrams, then a reject", [][]string{{"-A", "INPUT", "-p", "udp", "-m", "state", "--state", "NEW", "-m", "udp", "--dport", "8472", "-j", "ACCEPT"},
			{"-A", "INPUT", "-j", "REJECT", "--reject-with", "icmp-host-prohibited"}}, OK, `^no input chain drops UDP 8472 \(VXLAN\)$`},
		{"an accept of new datagrams by conntrack, then a reject", [][]string{{"-A", "INPUT", "-p", "udp", "-m", "conntrack", "--ctstate", "NEW,UNTRACKED", "-m", "udp", "--dport", "8472", "-j", "ACCEPT"},
			{"-A", "INPUT", "-j", "REJECT"}}, OK, `^no input chain drops UDP 8472 \(VXLAN\)$`},
		{"an accept of established datagrams, then a reject", [][]string{{"-A", "INPUT", "-p", "udp", "-m", "conntrack", "--ctstate", "ESTABLISHED", "-m", "udp", "--dport", "8472", "-j", "ACCEPT"},
			{"-A", "INPUT", "-j", "REJECT"}}, Fail, `^table ip filter chain INPUT drops UDP 8472 `},
		{"a commented accept", [][]string{{"-P", "INPUT", "DROP"}, {"-A", "INPUT", "-p", "udp", "--dport", "8472", "-m", "comment", "--comment", "weft", "-j", "ACCEPT"}}, OK, `^no input chain drops UDP 8472 \(VXLAN\)$`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ns := nettest.NewNS(t, "doctorin")
			for _, r := range tt.rules {
				nettest.MustRun(t, ns, append([]string{"iptables-nft"}, r...)...)
			}
			checkInputIn(t, ns, subnet.BackendConfig{}, inspect.FastPath{}, "v4", tt.status, tt.want, "")
		})
	}
}

// TestCheckInputPorts checks the families and ports firewall/input
// evaluates: both families, said so, when neither this node's lease nor a
// VXLAN device tells the underlay's; WireGuard's own IPv6 port in
// separate mode.
func TestCheckInputPorts(t *testing.T) {
	const (
		none    = "table inet f { chain in { type filter hook input priority 0;\n}\n}"
		ip6Drop = "table ip6 f { chain in { type filter hook input priority 0; udp dport 8472 drop\n}\n}"
		unknown = ` \(no lease for this node and no VXLAN device's local address: the underlay's family is not known, IPv4 and IPv6 checked\)$`
	)
	wg := subnet.BackendConfig{Type: subnet.BackendTypeWireGuard, ListenPort: 51820, ListenPortV6: 51821, Mode: subnet.WireGuardSeparate}
	for _, tt := range []struct {
		name, ruleset, underlay string
		b                       subnet.BackendConfig
		status                  Status
		want                    string
	}{
		{"no lease, nothing dropped", none, "", subnet.BackendConfig{}, OK, `^no input chain drops UDP 8472 \(VXLAN\) over IPv4 and IPv6` + unknown},
		{"no lease, ip6 table drops the port", ip6Drop, "", subnet.BackendConfig{}, Fail, `^table ip6 f chain in drops UDP 8472 over IPv6 \(VXLAN, every VXLAN datagram from the peers\) by rule "udp dport 8472 drop \(handle \d+\)"` + unknown},
		{"WireGuard separate, dual stack", none, "dual", wg, OK, `^no input chain drops UDP 51820 over IPv4 or UDP 51821 over IPv6 \(WireGuard\)$`},
		{"WireGuard separate, IPv6 port dropped", "table inet f { chain in { type filter hook input priority 0; udp dport 51821 drop\n}\n}", "dual", wg, Fail,
			`^table inet f chain in drops UDP 51821 over IPv6 \(WireGuard, `},
	} {
		t.Run(tt.name, func(t *testing.T) {
			runInput(t, tt.ruleset, tt.b, inspect.FastPath{}, tt.underlay, tt.status, tt.want, "")
		})
	}
}

// inputNode is a node's state with the leases of an underlay of IPv4
// (this node 192.168.77.1, peers .2 and .9), IPv6 (fd77::1, ::2, ::9) or
// both ("dual"); none for ""; this node's IPv4 lease alone for "alone".
func inputNode(underlay string) (self *subnet.Lease, leases []subnet.Lease) {
	for _, n := range []byte{1, 2, 9} {
		l := subnet.Lease{Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, n, 0}), 24),
			IPv6Subnet: netip.MustParsePrefix(fmt.Sprintf("fd00:10:244:%d::/64", n))}
		if underlay == "v4" || underlay == "dual" {
			l.Attrs.PublicIP = netip.AddrFrom4([4]byte{192, 168, 77, n})
		}
		if underlay == "v6" || underlay == "dual" {
			l.Attrs.PublicIPv6 = netip.MustParseAddr(fmt.Sprintf("fd77::%d", n))
		}
		if underlay == "alone" {
			l.Attrs.PublicIP = netip.AddrFrom4([4]byte{192, 168, 77, n})
			leases = []subnet.Lease{l} // a node without peers
			return &leases[0], leases
		}
		if underlay != "" {
			leases = append(leases, l)
		}
	}
	if len(leases) > 0 {
		self = &leases[0]
	}
	return self, leases
}

// runInput loads ruleset into a test namespace, runs checkInput on it for
// a node with backend b (VXLAN on port 8472 when not set) and checks its
// one result (and its fix, when fix is set).
func runInput(t *testing.T, ruleset string, b subnet.BackendConfig, fastPath inspect.FastPath, underlay string, status Status, want, fix string) {
	t.Helper()
	ns := nettest.NewNS(t, "doctorin")
	cmd := ns.Command(context.Background(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(ruleset)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -f: %v\n%s", err, out)
	}
	checkInputIn(t, ns, b, fastPath, underlay, status, want, fix)
}

// checkInputIn runs checkInput in ns (see runInput).
func checkInputIn(t *testing.T, ns *nettest.NS, b subnet.BackendConfig, fastPath inspect.FastPath, underlay string, status Status, want, fix string) {
	t.Helper()
	self, leases := inputNode(underlay)
	b.Type, b.Port = cmp.Or(b.Type, subnet.BackendTypeVXLAN), cmp.Or(b.Port, 8472)
	s := &state{Node: Node{Do: connectivity.Do(ns.Do), Leases: leases,
		Config: &subnet.Config{Backend: b}},
		r: &Report{}, self: self, fp: &fastPathRead{FastPath: fastPath}}
	checkInput(s)
	if len(s.r.Checks) != 1 || s.r.Checks[0].Status != status || !regexp.MustCompile(want).MatchString(s.r.Checks[0].Evidence) ||
		fix != "" && !regexp.MustCompile(fix).MatchString(s.r.Checks[0].Fix) {
		t.Fatalf("got %+v, want %s with %q (fix %q)", s.r.Checks, status, want, fix)
	}
}
