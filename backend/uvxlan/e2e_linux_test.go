package uvxlan

import (
	"net/netip"
	"testing"

	"github.com/weft-net/weft/internal/nettest"
)

var (
	subnetA = netip.MustParsePrefix("10.244.1.0/24")
	subnetB = netip.MustParsePrefix("10.244.2.0/24")
)

func TestEndToEnd(t *testing.T) {
	for _, tc := range []struct {
		name   string
		kernel bool // node b uses kernel VXLAN
		plain  bool
	}{
		{"uvxlan-uvxlan", false, false},
		{"uvxlan-uvxlan-plain", false, true},
		{"uvxlan-kernel", true, false},
		{"uvxlan-kernel-plain", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := nettest.NewUnderlay(t, netip.MustParsePrefix("192.168.77.0/24"), 1500)
			a := newUVNode(t, u, "a", subnetA, tc.plain)
			var b *testNode
			if tc.kernel {
				b = newKernelNode(t, u, "b", subnetB)
			} else {
				b = newUVNode(t, u, "b", subnetB, tc.plain)
			}
			connect(t, a, b)
			for _, d := range []struct {
				name     string
				from, to *testNode
			}{{"a-to-b", a, b}, {"b-to-a", b, a}} {
				t.Run(d.name, func(t *testing.T) {
					if out, err := ping(d.from, d.to.podIP); err != nil {
						t.Fatalf("ping: %v\n%s", err, out)
					}
					if out, err := ping(d.from, d.to.podIP, "-M", "do", "-s", "1422"); err != nil {
						t.Fatalf("DF ping of 1422 bytes: %v\n%s", err, out)
					}
					if out, err := ping(d.from, d.to.podIP, "-M", "do", "-s", "1423"); err == nil {
						t.Fatalf("DF ping of 1423 bytes passed a 1450 overlay\n%s", out)
					}
					transfer(t, d.from, d.to, 100<<20)
				})
			}
			t.Logf("a: %+v", a.b.Stats())
		})
	}
}
