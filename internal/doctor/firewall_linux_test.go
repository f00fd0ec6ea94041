package doctor

import (
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

func TestAcceptsNetwork(t *testing.T) {
	network := []byte{10, 244, 0, 0}
	rule := func(data []byte, v expr.VerdictKind) *nftables.Rule {
		return &nftables.Rule{Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 255, 0, 0}, Xor: []byte{0, 0, 0, 0}},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data},
			&expr.Verdict{Kind: v},
		}}
	}
	tests := []struct {
		name  string
		rules []*nftables.Rule
		want  bool
	}{
		{"accepts the network", []*nftables.Rule{rule([]byte{172, 17, 0, 0}, expr.VerdictAccept), rule(network, expr.VerdictAccept)}, true},
		{"another network", []*nftables.Rule{rule([]byte{172, 17, 0, 0}, expr.VerdictAccept)}, false},
		{"drops the network", []*nftables.Rule{rule(network, expr.VerdictDrop)}, false},
		{"no rules", nil, false},
	}
	for _, tt := range tests {
		if got := acceptsNetwork(tt.rules, network); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
