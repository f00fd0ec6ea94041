package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
	"github.com/weft-net/weft/test/e2e"
	"github.com/weft-net/weft/vtep"
)

// leaseValue is the JSON value of a VXLAN lease for a node at ip.
func leaseValue(t *testing.T, ip string, vni int, typ string) string {
	t.Helper()
	a := netip.MustParseAddr(ip)
	b, err := json.Marshal(subnet.LeaseAttrs{PublicIP: a, BackendType: typ,
		BackendData: &subnet.VXLANData{VNI: vni, VtepMAC: vtep.DeviceMAC(a, vni)}})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// hostileLeases are what any etcd client with the nodes' credentials can
// write: a route hijack, leases outside the Network or of the wrong shape,
// and keys and values that do not parse. Nine keys, each rejected once.
func hostileLeases(t *testing.T) map[string]string {
	return map[string]string{
		"0.0.0.0-1":       leaseValue(t, "192.168.77.66", 1, "vxlan"),
		"10.250.0.0-24":   leaseValue(t, "192.168.77.67", 1, "vxlan"),
		"10.244.200.0-25": leaseValue(t, "192.168.77.68", 1, "vxlan"),
		"10.244.201.0-24": leaseValue(t, "192.168.77.69", 42, "vxlan"),
		"10.244.202.0-24": leaseValue(t, "192.168.77.70", 1, "host-gw"),
		"10.244.203.0-24": leaseValue(t, "127.0.0.1", 1, "vxlan"),
		"10.244.204.0-24": leaseValue(t, "10.244.204.5", 1, "vxlan"),
		"10.244.205.0-24": `{"PublicIP":`,
		"garbage":         `x`,
	}
}

// TestHostileDatastore: hostile and garbage leases, a garbage network
// config while a weftd restarts, and random datagrams on the VXLAN port.
// Goal: every weftd stays alive, pods keep reaching each other, no hostile
// subnet is routed, new nodes still acquire, and each lease is counted.
func TestHostileDatastore(t *testing.T) {
	c := e2e.NewCluster(t, e2e.Options{Nodes: 2})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	a, b := n1.CNI.AddPod(t, "a"), n2.CNI.AddPod(t, "b")
	// Ready means a node's own lease and dataplane, not that it has
	// programmed the other node yet: wait for the pods to reach each other
	// before the fault.
	e2e.Eventually(t, 10*time.Second, "a reaches b", func() error { return e2e.Ping(a.NS, b.IP) })
	for k, v := range hostileLeases(t) {
		c.Put(e2e.Prefix+"/subnets/"+k, v)
	}
	n3 := c.AddNode("n3") // acquires beside 0.0.0.0-1
	n3.WaitReady()
	counted := 0.0
	e2e.Eventually(t, 10*time.Second, "rejections counted on every node", func() error {
		counted = 0
		for _, n := range c.Nodes {
			v, err := n.Metric("weft_leases_rejected_total")
			if err != nil || v != 9 {
				return fmt.Errorf("%s: weft_leases_rejected_total = %v (%v), want 9", n.Label, v, err)
			}
			counted += v
		}
		return nil
	})
	checkPeersRejects(t, c, n1, hostileLeases(t))
	routes := nettest.MustRun(t, n1, "ip", "route")
	hijacked := 0
	for _, p := range []string{"0.0.0.0/1", "10.250.0.0/24", "10.244.200.0/25", "10.244.201.0/24", "10.244.202.0/24", "10.244.203.0/24", "10.244.204.0/24"} {
		if containsRoute(routes, p) {
			hijacked++
			t.Errorf("hostile subnet %s routed on n1:\n%s", p, routes)
		}
	}
	// Garbage config while n1's weftd restarts: it waits, its dataplane
	// stays, pods still reach each other; a good config makes it ready.
	c.Put(e2e.Prefix+"/config", `{"Network": 7`)
	n1.Restart()
	garbage := sendGarbage(t, n2, n1.Addr, scale(2000, 100000))
	pingOK := e2e.Ping(a.NS, b.IP) == nil
	c.Put(e2e.Prefix+"/config", `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`)
	n1.WaitReady()
	alive := 0
	for _, n := range c.Nodes {
		if n.PID() != 0 {
			if code, _, err := n.HTTPGet("http://127.0.0.1:9470/readyz"); err == nil && code == 200 {
				alive++
			}
		}
	}
	pingAfter := e2e.Ping(a.NS, b.IP) == nil
	record(t, row{"garbage and hostile leases (9 keys: 0.0.0.0-1, outside the Network, wrong length, VNI, type, public IP, unparsable), garbage config during a restart, random datagrams on the VXLAN port",
		"nodes alive and ready of 3; hostile subnets routed; leases counted (3 nodes × 9); pods reachable during and after; datagrams sent",
		fmt.Sprintf("%d; %d; %.0f; %s; %d", alive, hijacked, counted, yesNo(pingOK && pingAfter), garbage),
		"3; 0; 27; yes", alive == 3 && hijacked == 0 && counted == 27 && pingOK && pingAfter, ""})
}

func containsRoute(routes, prefix string) bool {
	p := netip.MustParsePrefix(prefix)
	for _, line := range splitLines(routes) {
		if len(line) >= len(p.String()) && line[:len(p.String())] == p.String() {
			return true
		}
		if p.Bits() == 32 && line == p.Addr().String() {
			return true
		}
	}
	return false
}

// sendGarbage sends n random datagrams (some with a valid VXLAN header
// and VNI) from host src to dst's VXLAN port.
func sendGarbage(t *testing.T, src *e2e.Node, dst netip.Addr, n int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := src.DialContext(ctx, "udp", netip.AddrPortFrom(dst, subnet.DefaultVXLANPort).String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 1500)
	sent := 0
	for i := range n {
		l := r.IntN(len(buf))
		for j := range l {
			buf[j] = byte(r.Uint32())
		}
		if i%2 == 0 && l >= 8 {
			copy(buf, []byte{0x08, 0, 0, 0, 0, 0, 1, 0}) // VXLAN, VNI 1
		}
		if _, err := conn.Write(buf[:l]); err == nil {
			sent++
		}
	}
	return sent
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// checkPeersRejects runs `weftctl peers` on n against the cluster's etcd:
// it must apply weftd's checks, so every hostile lease that parses is listed
// as rejected, the real peers are all programmed, and it exits 0.
func checkPeersRejects(t *testing.T, c *e2e.Cluster, n *e2e.Node, hostile map[string]string) {
	t.Helper()
	out, err := n.Run(nettest.Binary(t, "weftctl"), "peers", "--etcd-endpoints", c.Etcd.Endpoint)
	if err != nil {
		t.Errorf("weftctl peers on %s with hostile leases in etcd: %v\n%s", n.Label, err, out)
	}
	rejected := 0
	for k, v := range hostile {
		var a subnet.LeaseAttrs
		if _, _, err := subnet.ParseKey(k); err != nil || json.Unmarshal([]byte(v), &a) != nil {
			continue // does not parse: weftctl skips it with a warning
		}
		rejected++
		if !strings.Contains(out, "rejected lease "+k+" ") {
			t.Errorf("weftctl peers on %s does not show %s as rejected:\n%s", n.Label, k, out)
		}
	}
	if want := fmt.Sprintf("all %d peers programmed as leased", len(c.Nodes)-1); !strings.Contains(out, want) || strings.Count(out, "rejected lease") != rejected {
		t.Errorf("weftctl peers on %s: want %q and %d rejected leases:\n%s", n.Label, want, rejected, out)
	}
}
