package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// startRaceNodes is how many nodes TestFlannel1531StartRace starts at once.
const startRaceNodes = 50

// startRaceBound is how long after the simultaneous start every node must
// have every peer.
const startRaceBound = 45 * time.Second

// TestFlannel1531StartRace answers flannel-io/flannel#1531 (a race at start
// leaves one peer's routes out, so one node cannot reach another): 50 nodes
// on one underlay and one etcd start weftd (vxlan) at the same moment. Each
// must end up with a route, a neighbour and an FDB entry for every one of
// its 49 peers, exactly those of the leases in etcd, within startRaceBound.
// The time from the start to each node's last peer is logged (p50, p99,
// last), with the races for a subnet that acquisition lost and retried.
// Last, two nodes ping the overlay address of every peer.
func TestFlannel1531StartRace(t *testing.T) {
	c := NewCluster(t, Options{})
	nodes := make([]*Node, startRaceNodes)
	for i := range nodes {
		nodes[i] = c.NewNode(fmt.Sprintf("n%d", i+1))
	}
	start := time.Now()
	for _, n := range nodes {
		n.Start()
	}
	complete := make([]time.Duration, len(nodes))
	left := len(nodes)
	for left > 0 && time.Since(start) < startRaceBound {
		for i, n := range nodes {
			if complete[i] == 0 && peerCounts(n) == [3]int{len(nodes) - 1, len(nodes) - 1, len(nodes) - 1} {
				complete[i] = time.Since(start)
				left--
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i, n := range nodes {
		if complete[i] == 0 {
			got := peerCounts(n)
			t.Errorf("%s: %d routes, %d neighbours, %d FDB entries %s after the start, want %d of each",
				n.Label, got[0], got[1], got[2], startRaceBound, len(nodes)-1)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	// Each node's state is exactly its peers' leases.
	subnets := make(map[netip.Prefix]*Node, len(nodes))
	for _, n := range nodes {
		subnets[n.Subnet()] = n
	}
	if len(subnets) != len(nodes) {
		t.Fatalf("%d distinct subnets for %d nodes", len(subnets), len(nodes))
	}
	for _, n := range nodes {
		want := peerSet{}
		for s, p := range subnets {
			if p != n {
				want.routes = append(want.routes, s.String())
				want.neighs = append(want.neighs, s.Addr().String())
				want.fdb = append(want.fdb, p.Addr.String())
			}
		}
		want.sort()
		got, err := readPeerSet(n)
		if err != nil {
			t.Fatal(err)
		}
		if d := want.diff(got); d != "" {
			t.Errorf("%s: peer state differs from the leases: %s", n.Label, d)
		}
	}
	slices.Sort(complete)
	races := 0
	for _, n := range nodes {
		log, _ := os.ReadFile(n.LogFile)
		races += strings.Count(string(log), "lost a race for a subnet")
	}
	recordFailure(t, "1531", fmt.Sprintf("%d nodes started at once: every node had all %d peers after p50 %s, p99 %s, last %s; %d acquisitions retried after a lost race",
		len(nodes), len(nodes)-1, complete[len(complete)/2].Round(time.Millisecond),
		complete[(len(complete)*99+99)/100-1].Round(time.Millisecond), complete[len(complete)-1].Round(time.Millisecond), races))
	for _, n := range []*Node{nodes[0], nodes[len(nodes)-1]} {
		for s, p := range subnets {
			if p != n {
				if err := Ping(n.NS, s.Addr(), "-W", "1"); err != nil {
					t.Errorf("%s cannot ping %s's overlay address %s: %v", n.Label, p.Label, s.Addr(), err)
				}
			}
		}
	}
}

// peerCounts counts the routes, permanent neighbours and permanent FDB
// entries on n's overlay device (all zero before it exists).
func peerCounts(n *Node) [3]int {
	s, err := readPeerSet(n)
	if err != nil {
		return [3]int{}
	}
	return [3]int{len(s.routes), len(s.neighs), len(s.fdb)}
}

// peerSet is what weft programmed on a node's overlay device, as sorted
// text: route destinations, neighbour addresses, FDB destinations.
type peerSet struct{ routes, neighs, fdb []string }

func (s *peerSet) sort() {
	slices.Sort(s.routes)
	slices.Sort(s.neighs)
	slices.Sort(s.fdb)
}

func (s peerSet) diff(got peerSet) string {
	var d []string
	for _, x := range []struct {
		what      string
		want, got []string
	}{{"routes", s.routes, got.routes}, {"neighbours", s.neighs, got.neighs}, {"FDB", s.fdb, got.fdb}} {
		if !slices.Equal(x.want, x.got) {
			d = append(d, fmt.Sprintf("%s %v, want %v", x.what, x.got, x.want))
		}
	}
	return strings.Join(d, "; ")
}

// readPeerSet reads n's overlay device state through netlink in the test
// process (polling 50 nodes with ip(8) would cost 150 processes a round).
func readPeerSet(n *Node) (peerSet, error) {
	h := n.Handle
	link, err := h.LinkByName(device)
	if err != nil {
		return peerSet{}, err
	}
	var s peerSet
	routes, err := h.RouteList(link, netlink.FAMILY_V4)
	if err != nil {
		return s, err
	}
	for _, r := range routes {
		if r.Dst != nil && r.Gw != nil {
			s.routes = append(s.routes, ipNet(r.Dst).String())
		}
	}
	neighs, err := h.NeighList(link.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		return s, err
	}
	for _, nb := range neighs {
		if nb.State&netlink.NUD_PERMANENT != 0 {
			s.neighs = append(s.neighs, nb.IP.String())
		}
	}
	fdb, err := h.NeighList(link.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		return s, err
	}
	for _, nb := range fdb {
		if nb.State&netlink.NUD_PERMANENT != 0 && nb.IP != nil {
			s.fdb = append(s.fdb, nb.IP.String())
		}
	}
	s.sort()
	return s, nil
}

func ipNet(n *net.IPNet) netip.Prefix {
	a, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones)
}
