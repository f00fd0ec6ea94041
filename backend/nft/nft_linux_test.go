package nft

import (
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// TestSameRules: a counter compares equal whatever it counted and a set
// lookup by its set's name whatever id the kernel gave the set; any other
// difference (a verdict, an inverted lookup, another set, the comment)
// makes the rule another one.
func TestSameRules(t *testing.T) {
	want := []Rule{{Comment: "c", Exprs: []expr.Any{
		&expr.Lookup{SourceRegister: 1, SetName: "peers"},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}}}
	rule := func(l *expr.Lookup, v expr.VerdictKind, comment string) []*nftables.Rule {
		return []*nftables.Rule{{UserData: Comment(comment), Exprs: []expr.Any{
			l, &expr.Counter{Packets: 42, Bytes: 4200}, &expr.Verdict{Kind: v},
		}}}
	}
	for _, tc := range []struct {
		name string
		have []*nftables.Rule
		same bool
	}{
		{"as read back", rule(&expr.Lookup{SourceRegister: 1, SetName: "peers", SetID: 7}, expr.VerdictDrop, "c"), true},
		{"other verdict", rule(&expr.Lookup{SourceRegister: 1, SetName: "peers"}, expr.VerdictAccept, "c"), false},
		{"inverted", rule(&expr.Lookup{SourceRegister: 1, SetName: "peers", Invert: true}, expr.VerdictDrop, "c"), false},
		{"other set", rule(&expr.Lookup{SourceRegister: 1, SetName: "others"}, expr.VerdictDrop, "c"), false},
		{"other comment", rule(&expr.Lookup{SourceRegister: 1, SetName: "peers"}, expr.VerdictDrop, "d"), false},
		{"missing", nil, false},
	} {
		if got := SameRules(tc.have, want); got != tc.same {
			t.Errorf("%s: SameRules = %v, want %v", tc.name, got, tc.same)
		}
	}
}
