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

func TestJumpTarget(t *testing.T) {
	jump := &nftables.Rule{Exprs: []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictJump, Chain: "WEFT-FWD"}}}
	conditional := &nftables.Rule{Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte("cni0\x00")},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: "OTHER"},
	}}
	accept := &nftables.Rule{Exprs: []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept}}}
	for _, tt := range []struct {
		r    *nftables.Rule
		want string
	}{{conditional, ""}, {jump, "WEFT-FWD"}, {accept, ""}} {
		if got := jumpTarget(tt.r); got != tt.want {
			t.Errorf("jumpTarget(%v) = %q, want %q", tt.r.Exprs, got, tt.want)
		}
	}
}
