package faults

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/test/e2e"
)

// TestEtcdLeaderKills: a 3-member etcd whose leader is killed every 5 s
// (and brought back before the next kill), while leases are renewed every
// ~5 s and a pod pings across nodes every 10 ms. Goal: no lease lost, no
// peer removed, no ping lost.
func TestEtcdLeaderKills(t *testing.T) {
	span := time.Duration(scale(15, 60)) * time.Second
	c := e2e.NewCluster(t, e2e.Options{Nodes: 2, EtcdMembers: 3,
		Args: []string{"--subnet-lease-ttl", "30s", "--subnet-lease-renew-margin", "25s"}})
	n1 := c.Nodes[0]
	a, b := n1.CNI.AddPod(t, "a"), c.Nodes[1].CNI.AddPod(t, "b")
	// Ready means a node's own lease and dataplane, not that it has
	// programmed the other node yet: wait for the pods to reach each other
	// before the fault.
	e2e.Eventually(t, 10*time.Second, "a reaches b", func() error { return e2e.Ping(a.NS, b.IP) })
	before := nettest.MustRun(t, n1, "ip", "route", "show", "dev", "weft.1")
	waitPings := startPingLoss(a.NS, b.IP, span+2*time.Second)
	kills := 0
	for start := time.Now(); time.Since(start) < span; {
		leader, err := c.EtcdHA.Leader(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		killedAt := time.Now()
		leader.Kill()
		kills++
		if err := leader.Start(); err != nil {
			t.Fatal(err)
		}
		if wait := 5*time.Second - time.Since(killedAt); wait > 0 {
			time.Sleep(wait) // the fault's period: timing, not synchronisation
		}
	}
	pings, err := waitPings()
	if err != nil {
		t.Fatal(err)
	}
	lost, removed := 0, 0
	for _, n := range c.Nodes {
		log, _ := os.ReadFile(n.LogFile)
		lost += strings.Count(string(log), "acquiring again")
		v, err := n.Metric("weft_lease_events_total", "type", "removed")
		if err == nil {
			removed += int(v)
		}
	}
	after := nettest.MustRun(t, n1, "ip", "route", "show", "dev", "weft.1")
	for _, l := range splitLines(before) {
		if !strings.Contains(after, l) {
			removed++
		}
	}
	record(t, row{fmt.Sprintf("3-member etcd, leader killed every 5 s for %s (%d kills), renewals every ~5 s", span, kills),
		"leases lost; spurious peer removals (watch events and routes); pings lost",
		fmt.Sprintf("%d; %d; %s", lost, removed, pings),
		"0; 0; 0", lost == 0 && removed == 0 && pings.Lost == 0, ""})
}
