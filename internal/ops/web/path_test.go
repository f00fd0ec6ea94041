package web

import (
	"net/netip"
	"testing"

	"github.com/weft-net/weft/internal/ops/inspect"
)

// TestComposeReturnLast: explain's "return" hop, the way back to the
// source pod, is drawn after the destination pod's hops, not among the
// hops on the way there.
func TestComposeReturnLast(t *testing.T) {
	p := &inspect.Path{Src: netip.MustParseAddr("10.244.1.2"), Dst: netip.MustParseAddr("10.244.2.2"),
		Hops: []inspect.Hop{{Step: "route"}, {Step: "return", Detail: "the replies"}, {Step: "deliver"}}}
	link := inspect.PodLink{Iface: "eth0", HostVeth: "veth1", Bridge: "cni0"}
	v := Compose(p, "n1", &PodEnd{Pod: "a", Node: "n1", Link: link}, &PodEnd{Pod: "b", Node: "n2", Link: link})
	var steps []string
	for _, h := range v.Hops {
		steps = append(steps, h.Step)
	}
	last := v.Hops[len(v.Hops)-1]
	if last.Step != "return" || !last.Explain || last.Object != "uvxlan's fast-path programs on n1" {
		t.Fatalf("hops %q, want the return hop last, explain's, on n1; last %+v", steps, last)
	}
	for _, h := range v.Hops[:len(v.Hops)-1] {
		if h.Step == "return" {
			t.Errorf("a second return hop in %q", steps)
		}
	}
}
