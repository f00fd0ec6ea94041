package daemon

import (
	"maps"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/vtep"
)

// TestPeerSetTable: after every batch of random events (new, changed,
// rejected and removed leases, among them leases that give the same subnet
// as another and the node's own), the table the peer set builds step by
// step is the one built from all its leases; where two leases give one
// subnet, either's row is right.
func TestPeerSetTable(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00::/48","IPv6SubnetLen":64}`))
	if err != nil {
		t.Fatal(err)
	}
	v4 := func(i int) netip.Prefix { return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24) }
	v6 := func(i int) netip.Prefix {
		return netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0, 0, 0, byte(i)}), 64)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	lease := func(a, b int) subnet.Lease {
		ip := netip.AddrFrom4([4]byte{192, 168, 77, byte(1 + rng.IntN(40))})
		ip6 := netip.AddrFrom16([16]byte{0xfd, 0x99, 15: byte(1 + rng.IntN(40))})
		l := subnet.Lease{Subnet: v4(a), IPv6Subnet: v6(b), Attrs: subnet.LeaseAttrs{
			PublicIP: ip, PublicIPv6: ip6, BackendType: "vxlan",
			BackendData:   &subnet.VXLANData{VNI: 1, VtepMAC: vtep.DeviceMAC(ip, 1)},
			BackendV6Data: &subnet.VXLANData{VNI: 1, VtepMAC: vtep.DeviceMAC(ip6, 1)}}}
		if rng.IntN(10) == 0 { // rejected: another backend
			l.Attrs.BackendType = "host-gw"
		}
		return l
	}
	self := lease(0, 0)
	self.Attrs.BackendType = "vxlan"
	p := newPeerSet(cfg, self, subnet.NewRejections(nil, nil), "vxlan")
	var keys [][2]int // the (v4, v6) index pairs written so far
	for round := range 3000 {
		n := 1 + rng.IntN(4)
		if round%100 == 99 {
			n = 200 // a change of many leases
		}
		var batch []subnet.Event
		for range n {
			switch {
			case len(keys) > 0 && rng.IntN(4) == 0:
				k := keys[rng.IntN(len(keys))]
				l := subnet.Lease{Subnet: v4(k[0]), IPv6Subnet: v6(k[1])}
				batch = append(batch, subnet.Event{Type: subnet.EventRemoved, Lease: l})
			default:
				// 60 subnets for each family: pairs collide on one of them now and then
				k := [2]int{rng.IntN(60), rng.IntN(60)}
				keys = append(keys, k)
				batch = append(batch, subnet.Event{Type: subnet.EventAdded, Lease: lease(k[0], k[1])})
			}
		}
		for _, ev := range batch {
			p.apply(ev)
		}
		prev := maps.Clone(p.tab)
		ups, rebuilt := p.update()
		got := p.tab
		if !rebuilt { // the rows returned are what turns the last table into this one
			for _, u := range ups {
				if u.Gone {
					delete(prev, u.Subnet)
				} else {
					prev[u.Subnet] = u.Peer
				}
			}
			if !maps.Equal(prev, got) {
				t.Fatalf("round %d: the last table with the rows returned (%v) is %v, not the table %v", round, ups, prev, got)
			}
		}
		// What the rows may be: every lease's rows, all givers of a subnet.
		may := map[netip.Prefix][]vtep.Peer{}
		for l := range p.all {
			for q, v := range vtep.FromLeases([]subnet.Lease{l}, self) {
				may[q] = append(may[q], v)
			}
		}
		if len(got) != len(may) {
			t.Fatalf("round %d: table has %d rows, the leases give %d subnets", round, len(got), len(may))
		}
		for q, v := range got {
			ok := false
			for _, w := range may[q] {
				ok = ok || w == v
			}
			if !ok {
				t.Fatalf("round %d: row %s → %v, the leases give %v", round, q, v, may[q])
			}
		}
	}
	if p.rebuilds < 30 || p.rebuilds > 2000 {
		t.Errorf("%d of 3000 tables built in full: the test does not cover both ways", p.rebuilds)
	}
	t.Logf("%d of 3000 tables built in full, the others step by step; %d leases at the end", p.rebuilds, len(p.leases))
}
