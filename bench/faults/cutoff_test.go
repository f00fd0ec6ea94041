package faults

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/test/e2e"
)

// TestEtcdCutOff: nodes reach etcd over the underlay; n1 is firewalled off
// from it (every packet to and from etcd dropped in n1's namespace) while
// its renewals are due every ~5 s and a pod on n1 pings a pod on n2 every
// 10 ms. Halfway through, a new peer's lease is written. Goal: n1's
// dataplane stays as it was and no ping is lost; n2 keeps n1's lease (24 h
// TTL) and its routes; after the cut n1 renews and learns the new peer
// within 10 s.
func TestEtcdCutOff(t *testing.T) {
	cut := time.Duration(scale(20, 180)) * time.Second
	// The TTL stays 24 h; the margin makes renewals due every ~5 s.
	c := e2e.NewCluster(t, e2e.Options{Nodes: 2, EtcdOnUnderlay: true,
		Args: []string{"--subnet-lease-renew-margin", "23h59m55s"}})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	a, b := n1.CNI.AddPod(t, "a"), n2.CNI.AddPod(t, "b")
	// Ready means a node's own lease and dataplane, not that it has
	// programmed the other node yet: wait for the pods to reach each other
	// before the fault.
	e2e.Eventually(t, 10*time.Second, "a reaches b", func() error { return e2e.Ping(a.NS, b.IP) })
	key := e2e.Prefix + "/subnets/" + subnet.Lease{Subnet: n1.Subnet()}.Key()
	before1, before2 := dataplane(t, n1), dataplane(t, n2)
	waitPings := startPingLoss(a.NS, b.IP, cut+10*time.Second)
	lift := cutOff(t, n1.NS, c.EtcdHost.Addr)
	cutAt := time.Now()
	if err := dialFails(n1, c.EtcdHost.Addr); err != nil {
		t.Fatal(err)
	}
	pause(cut / 2)
	newPeer := netip.MustParsePrefix("10.244.250.0/24")
	c.Put(e2e.Prefix+"/subnets/"+subnet.Lease{Subnet: newPeer}.Key(), leaseValue(t, "192.168.77.200", 1, "vxlan"))
	pause(cut - time.Since(cutAt))
	during1 := dataplane(t, n1)
	failed := countSince(n1, cutAt, "cannot renew the lease")
	renewedDuring := renewalsSince(n1, cutAt)
	lift()
	lifted := time.Now()
	t.Logf("cut from %s to %s", cutAt.Format(time.StampMilli), lifted.Format(time.StampMilli))
	renewed, learned := afterCut(t, n1, lifted, newPeer)
	pings, err := waitPings()
	if err != nil {
		t.Fatal(err)
	}
	changed := diffLines(before1, during1) + diffLines(during1, before1)
	removed2 := diffLines(before2, dataplane(t, n2)) + removals(n2)
	ttl := leaseTTL(t, c.Client, key)
	t.Logf("during the cut: %d failed renewals logged, %d succeeded", failed, renewedDuring)
	if failed == 0 || renewedDuring > 0 {
		t.Errorf("the cut did not cut weftd off: %d failed renewals, %d succeeded during it", failed, renewedDuring)
	}
	record(t, row{fmt.Sprintf("one node firewalled off from etcd for %s (nftables drop in its namespace), renewals due every ~5 s, a new peer's lease written halfway", cut),
		"pings lost across; cut node's routes, FDB and neighbour entries changed; other node's entries or events removing it; its lease's TTL left at the end; time after the cut to renew; to learn the new peer",
		fmt.Sprintf("%s; %d; %d; %.1f h; %.1f s; %.1f s", pings, changed, removed2, ttl.Hours(), renewed.Seconds(), learned.Seconds()),
		"0; 0; 0; > 23 h; ≤ 10 s; ≤ 10 s",
		pings.Lost == 0 && changed == 0 && removed2 == 0 && ttl > 23*time.Hour && renewed <= 10*time.Second && learned <= 10*time.Second, ""})
}

// dataplane is n's overlay state: routes, FDB and neighbour entries of the
// VXLAN device.
func dataplane(t *testing.T, n *e2e.Node) string {
	t.Helper()
	return nettest.MustRun(t, n, "ip", "route", "show", "dev", "weft.1") +
		nettest.MustRun(t, n, "bridge", "fdb", "show", "dev", "weft.1") +
		nettest.MustRun(t, n, "ip", "neigh", "show", "dev", "weft.1")
}

// diffLines counts the lines of a missing from b.
func diffLines(a, b string) int {
	missing := 0
	for _, l := range splitLines(a) {
		if l != "" && !strings.Contains(b, l) {
			missing++
		}
	}
	return missing
}

// removals is the number of lease removals n's weftd has seen.
func removals(n *e2e.Node) int {
	v, err := n.Metric("weft_lease_events_total", "type", "removed")
	if err != nil {
		return 0 // no removal yet: the series does not exist
	}
	return int(v)
}

// dialFails checks that n cannot open a TCP connection to dst.
func dialFails(n *e2e.Node, dst netip.AddrPort) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := n.DialContext(ctx, "tcp", dst.String())
	if err == nil {
		conn.Close()
		return fmt.Errorf("%s still reaches %s through the cut", n.Label, dst)
	}
	return nil
}

// afterCut waits until n logged a renewal after lifted and routes newPeer,
// and returns how long after lifted each happened.
func afterCut(t *testing.T, n *e2e.Node, lifted time.Time, newPeer netip.Prefix) (renewed, learned time.Duration) {
	t.Helper()
	for renewed == 0 || learned == 0 {
		if time.Since(lifted) > 2*time.Minute {
			t.Fatalf("%s 2 min after the cut: renewed after %s, learned the new peer after %s (0: not yet)", n.Label, renewed, learned)
		}
		if renewed == 0 && renewalsSince(n, lifted) > 0 {
			renewed = time.Since(lifted)
		}
		if learned == 0 && containsRoute(nettest.MustRun(t, n, "ip", "route", "show", "dev", "weft.1"), newPeer.String()) {
			learned = time.Since(lifted)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return renewed, learned
}

// leaseTTL is the time left on the etcd lease attached to key.
func leaseTTL(t *testing.T, c *clientv3.Client, key string) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("lease %s: %v (%d keys)", key, err, len(resp.Kvs))
	}
	ttl, err := c.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	if err != nil {
		t.Fatalf("lease %s: %v", key, err)
	}
	return time.Duration(ttl.TTL) * time.Second
}

// pause waits d: the length of a fault, timing rather than synchronisation.
func pause(d time.Duration) {
	if d > 0 {
		time.Sleep(d)
	}
}
