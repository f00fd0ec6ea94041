package vxlan

import (
	"net/netip"
	"testing"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/vtep"
)

// TestPeers is a transcript: each step sets a table and states what the
// kernel must then show on both devices, exactly in Flannel's form.
func TestPeers(t *testing.T) {
	u := nettest.NewUnderlay(t, ul4, 0)
	n1 := newNode(t, u, 1)
	b := newBackend(t, n1.config())
	start(t, b)

	pA := netip.MustParsePrefix("10.244.2.0/24")
	pA6 := netip.MustParsePrefix("fd00:10:244:2::/64")
	pB := netip.MustParsePrefix("10.244.3.0/24")
	pSelf := netip.MustParsePrefix("10.244.99.0/24")
	macA, macA2, macB := mac("0a:00:00:00:00:02"), mac("0a:00:00:00:00:22"), mac("0a:00:00:00:00:03")
	ipA, ipA6, ipB := netip.MustParseAddr("192.168.77.2"), netip.MustParseAddr("fd77::2"), netip.MustParseAddr("192.168.77.3")

	ipB2 := netip.MustParseAddr("192.168.77.4")
	kernel6 := []string{"fd00:10:244:1:: proto kernel metric 256 pref medium", "fe80::/64 proto kernel metric 256 pref medium"}
	steps := []struct {
		name         string
		table        vtep.Table
		want4, want6 kernelState
	}{
		{
			name: "add peers",
			table: vtep.Table{
				pA:  {MAC: macA, Addr: ipA},
				pA6: {MAC: macA, Addr: ipA6},
				pB:  {MAC: macB, Addr: ipB},
				// Rows for this node itself are ignored.
				n1.Subnet: {MAC: macB, Addr: ipB},
				pSelf:     {MAC: macB, Addr: n1.Addr},
			},
			want4: kernelState{
				Neigh: []string{"10.244.2.0 lladdr 0a:00:00:00:00:02 PERMANENT", "10.244.3.0 lladdr 0a:00:00:00:00:03 PERMANENT"},
				FDB:   []string{"0a:00:00:00:00:02 dst 192.168.77.2 self permanent", "0a:00:00:00:00:03 dst 192.168.77.3 self permanent"},
				Route: []string{"10.244.2.0/24 via 10.244.2.0 proto 87 onlink", "10.244.3.0/24 via 10.244.3.0 proto 87 onlink"},
			},
			want6: kernelState{
				Neigh: []string{"fd00:10:244:2:: lladdr 0a:00:00:00:00:02 PERMANENT"},
				FDB:   []string{"0a:00:00:00:00:02 dst fd77::2 self permanent"},
				Route: append([]string{"fd00:10:244:2::/64 via fd00:10:244:2:: proto 87 metric 1024 onlink pref medium"}, kernel6...),
			},
		},
		{
			// A's device was recreated with a new MAC (a Flannel node does
			// that on restart) and B moved to a new address: the old FDB
			// entries must go, not linger next to the new ones.
			name: "peer MAC and address change",
			table: vtep.Table{
				pA:  {MAC: macA2, Addr: ipA},
				pA6: {MAC: macA2, Addr: ipA6},
				pB:  {MAC: macB, Addr: ipB2},
			},
			want4: kernelState{
				Neigh: []string{"10.244.2.0 lladdr 0a:00:00:00:00:22 PERMANENT", "10.244.3.0 lladdr 0a:00:00:00:00:03 PERMANENT"},
				FDB:   []string{"0a:00:00:00:00:03 dst 192.168.77.4 self permanent", "0a:00:00:00:00:22 dst 192.168.77.2 self permanent"},
				Route: []string{"10.244.2.0/24 via 10.244.2.0 proto 87 onlink", "10.244.3.0/24 via 10.244.3.0 proto 87 onlink"},
			},
			want6: kernelState{
				Neigh: []string{"fd00:10:244:2:: lladdr 0a:00:00:00:00:22 PERMANENT"},
				FDB:   []string{"0a:00:00:00:00:22 dst fd77::2 self permanent"},
				Route: append([]string{"fd00:10:244:2::/64 via fd00:10:244:2:: proto 87 metric 1024 onlink pref medium"}, kernel6...),
			},
		},
		{
			name:  "remove A",
			table: vtep.Table{pB: {MAC: macB, Addr: ipB2}},
			want4: kernelState{
				Neigh: []string{"10.244.3.0 lladdr 0a:00:00:00:00:03 PERMANENT"},
				FDB:   []string{"0a:00:00:00:00:03 dst 192.168.77.4 self permanent"},
				Route: []string{"10.244.3.0/24 via 10.244.3.0 proto 87 onlink"},
			},
			want6: kernelState{Route: kernel6},
		},
		{
			name:  "empty table",
			table: vtep.Table{},
			want6: kernelState{Route: kernel6},
		},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			b.Set(s.table)
			waitReady(t, b)
			waitState(t, n1.NS, "weft.1", s.want4)
			waitState(t, n1.NS, "weft-v6.1", s.want6)
		})
	}
}
