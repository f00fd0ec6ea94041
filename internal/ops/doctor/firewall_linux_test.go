package doctor

import (
	"net/netip"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
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
	for _, tt := range []struct {
		name string
		r    *nftables.Rule
		want string
	}{
		{"udp dport 8472 accept", rule(expr.VerdictAccept, udp, dport(0x18)), "accept"},
		{"udp dport 8472 drop", rule(expr.VerdictDrop, udp, dport(0x18)), "drop"},
		{"udp dport 8473 accept", rule(expr.VerdictAccept, udp, dport(0x19)), ""},
		{"tcp dport 8472 accept", rule(expr.VerdictAccept, tcp, dport(0x18)), ""},
		{"ct state established accept", rule(expr.VerdictAccept, ct), ""},
		{"accept", rule(expr.VerdictAccept), "accept"},
		{"drop", rule(expr.VerdictDrop), "drop"},
	} {
		if got := portRule(tt.r, 8472); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}
