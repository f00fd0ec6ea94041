package faults

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/etcdlocal"
	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/test/e2e"
)

// TestEtcdOutage: etcd stops for a while and comes back, while a pod on n1
// pings a pod on n2 (every 10 ms asked). Leases are renewed every few seconds, so
// renewals fail throughout the outage. Goal: no ping lost, no route
// removed, every node renews within 10 s of etcd's return.
func TestEtcdOutage(t *testing.T) {
	outage := time.Duration(scale(5, 120)) * time.Second
	// A lease outliving the outage, renewed every ~5 s before it.
	ttl := outage + 60*time.Second
	c := e2e.NewCluster(t, e2e.Options{Nodes: 2, Args: []string{
		"--subnet-lease-ttl", ttl.String(), "--subnet-lease-renew-margin", (ttl - 5*time.Second).String()}})
	n1 := c.Nodes[0]
	a, b := n1.CNI.AddPod(t, "a"), c.Nodes[1].CNI.AddPod(t, "b")
	// Ready means a node's own lease and dataplane, not that it has
	// programmed the other node yet: wait for the pods to reach each other
	// before the fault.
	e2e.Eventually(t, 10*time.Second, "a reaches b", func() error { return e2e.Ping(a.NS, b.IP) })
	before := nettest.MustRun(t, n1, "ip", "route", "show", "dev", "weft.1")
	waitPings := startPingLoss(a.NS, b.IP, outage+4*time.Second)
	c.Etcd.Close()
	stopped := time.Now()
	for time.Since(stopped) < outage {
		time.Sleep(100 * time.Millisecond) // the outage lasts this long: timing, not synchronisation
	}
	srv, err := etcdlocal.Start(filepath.Join(c.Dir, "etcd"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	back := time.Now()
	t.Logf("etcd stopped at %s, serving again at %s", stopped.Format(time.StampMilli), back.Format(time.StampMilli))
	renewedBefore := make([]int, len(c.Nodes))
	for i, n := range c.Nodes {
		renewedBefore[i] = renewalsSince(n, stopped)
	}
	var worst time.Duration
	for i, n := range c.Nodes {
		e2e.Eventually(t, 60*time.Second, n.Label+" renews after etcd's return", func() error {
			if renewalsSince(n, stopped) <= renewedBefore[i] {
				return fmt.Errorf("no renewal yet")
			}
			return nil
		})
		worst = max(worst, time.Since(back)) // nodes are checked in turn: the last is the slowest
	}
	pings, err := waitPings()
	if err != nil {
		t.Fatal(err)
	}
	after := nettest.MustRun(t, n1, "ip", "route", "show", "dev", "weft.1")
	removed := 0
	for _, l := range splitLines(before) {
		if !strings.Contains(after, l) {
			removed++
		}
	}
	record(t, row{fmt.Sprintf("etcd stopped for %s, then back (lease renewals due every ~5 s)", outage),
		"pings lost; routes removed on n1; time until every node renewed after etcd's return",
		fmt.Sprintf("%s; %d; %.1f s", pings, removed, worst.Seconds()),
		"0; 0; ≤ 10 s", pings.Lost == 0 && removed == 0 && worst <= 10*time.Second, ""})
}

// renewalsSince counts the "renewed lease" lines n's weftd logged after
// since.
func renewalsSince(n *e2e.Node, since time.Time) int { return countSince(n, since, "renewed lease") }

// countSince counts the lines containing msg that n's weftd logged after
// since (log lines carry time=RFC3339).
func countSince(n *e2e.Node, since time.Time, msg string) int {
	b, _ := os.ReadFile(n.LogFile)
	count := 0
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, msg) {
			continue
		}
		f := strings.Fields(l)
		if len(f) == 0 || !strings.HasPrefix(f[0], "time=") {
			continue
		}
		if ts, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(f[0], "time=")); err == nil && ts.After(since) {
			count++
		}
	}
	return count
}
