package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/internal/testkit/plugintest"
)

// Flannel failure test of WireGuard's peers (docs/flannel-failures.md).

// TestFlannel1421WireGuardPeers answers flannel-io/flannel#1421, #1963 and
// k3s-io/k3s#5216 (WireGuard peers left for nodes that are gone, two peers
// for one node after its key changed, "file exists" errors in the logs):
// through nodes joining and leaving (a lease deleted, a lease expired), a
// node restarting with a new key, and restarts of weftd with the same key,
// every node's WireGuard peers must be exactly the other leases: one peer
// per lease, with the lease's key, its public IP and port as endpoint and
// its subnet as allowed IPs. The peers are the ones weftd configured on its
// device, read from its "peer set" and "peer removed" lines (an in-process
// device, which nothing outside weftd can read); with a 1 s persistent
// keepalive every peer is also seen on the wire, so the underlay must carry
// WireGuard datagrams to the live nodes and none to a node that left. Pods
// on every pair of live nodes reach each other, and no weftd logs a
// warning or an error.
func TestFlannel1421WireGuardPeers(t *testing.T) {
	c := NewCluster(t, Options{NoConfig: true})
	c.Put(Prefix+"/config", `{"Network":"10.244.0.0/16","Backend":{"Type":"wireguard","PersistentKeepaliveInterval":1}}`)
	c.OnNode = func(n *Node) { n.Env = []string{"WIREGUARD_KEY_FILE=" + wgKeyFile(c, n)} }
	for _, l := range []string{"n1", "n2", "n3"} {
		c.AddNode(l)
	}
	for _, n := range c.Nodes {
		n.WaitReady()
	}
	live := map[*Node]bool{}
	for _, n := range c.Nodes {
		live[n] = true
	}
	pods := map[*Node]*plugintest.Pod{}
	// check waits for every live node's peers to be the other leases (the
	// time since the change, at since, is logged), has the pods ping, and
	// with wire set captures n1's underlay for the endpoints it sends to.
	check := func(t *testing.T, step string, since time.Time, wire bool) {
		t.Helper()
		var nodes []*Node
		for _, n := range c.Nodes {
			if live[n] {
				nodes = append(nodes, n)
				if pods[n] == nil {
					pods[n] = n.CNI.AddPod(t, n.Label+"-p")
				}
			}
		}
		for _, n := range nodes {
			Eventually(t, 10*time.Second, step+": "+n.Label+"'s peers are the other leases", func() error {
				return samePeers(wgLeasePeers(t, c, n), loggedPeers(t, n))
			})
		}
		converged := time.Since(since)
		for _, from := range nodes {
			for _, to := range nodes {
				if from != to {
					Eventually(t, 20*time.Second, step+": "+from.Label+" → "+to.Label, func() error {
						return Ping(pods[from].NS, pods[to].IP, "-W", "1")
					})
				}
			}
		}
		// With a 1 s keepalive every configured peer is sent to at least
		// every second, or, without a session (a node that is gone), a
		// handshake initiation every 5 s: 5.5 s of n1's underlay show the
		// endpoints of all its peers.
		if wire {
			n1 := c.Nodes[0]
			lines := capture(t, n1, "udp dst port 51820 and src host "+n1.Addr.String(), func() { time.Sleep(5500 * time.Millisecond) })
			got := map[string]bool{}
			for _, l := range lines {
				if f := strings.Fields(l); len(f) > 4 && f[3] == ">" {
					got[strings.TrimSuffix(f[4], ":")] = true
				}
			}
			want := map[string]bool{}
			for _, n := range nodes {
				if n != n1 {
					want[n.Addr.String()+".51820"] = true
				}
			}
			if !maps.Equal(got, want) {
				t.Errorf("%s: n1 sends WireGuard to %v, want %v", step, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
			}
		}
		recordFailure(t, "1421", fmt.Sprintf("%s: %d nodes, peers exact on each %s after the change; pods reach each other", step, len(nodes), converged.Round(time.Millisecond)))
	}
	check(t, "three nodes", time.Now(), false)

	n4, n5 := c.AddNode("n4"), c.AddNode("n5")
	n4.WaitReady()
	n5.WaitReady()
	live[n4], live[n5] = true, true
	check(t, "n4 and n5 joined (since both were ready)", time.Now(), true)

	n4.Stop()
	c.Delete(leaseKey(n4))
	live[n4] = false
	check(t, "n4 left, its lease deleted", time.Now(), true)

	n5.Stop()
	c.Expire(leaseKey(n5))
	live[n5] = false
	check(t, "n5 left, its lease expired", time.Now(), true)

	n2 := c.Nodes[1]
	old := readKey(t, wgKeyFile(c, n2)).PublicKey().String()
	n2.Stop()
	if err := os.Remove(wgKeyFile(c, n2)); err != nil {
		t.Fatal(err)
	}
	n2.Start()
	start := time.Now()
	n2.WaitReady()
	if readKey(t, wgKeyFile(c, n2)).PublicKey().String() == old {
		t.Fatal("n2 kept its key")
	}
	check(t, "n2 restarted with a new key (since its start)", start, false)

	for _, n := range []*Node{c.Nodes[0], c.Nodes[2]} {
		n.Stop()
		n.Start()
		start := time.Now()
		n.WaitReady()
		check(t, n.Label+" restarted with its key (since its start)", start, false)
	}

	for _, n := range c.Nodes {
		log, _ := os.ReadFile(n.LogFile)
		for _, l := range strings.Split(string(log), "\n") {
			if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") || strings.Contains(strings.ToLower(l), "file exists") {
				t.Errorf("%s logged: %s", n.Label, l)
			}
		}
	}
}

// wgPeer is a WireGuard peer as weft configures it.
type wgPeer struct{ Endpoint, AllowedIPs string }

// wgLeasePeers is what n's peers must be: one per other lease in etcd,
// keyed by its public key.
func wgLeasePeers(t *testing.T, c *Cluster, n *Node) map[string]wgPeer {
	t.Helper()
	resp, err := c.Client.Get(t.Context(), Prefix+"/subnets/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	own := leaseKey(n)
	out := map[string]wgPeer{}
	for _, kv := range resp.Kvs {
		if string(kv.Key) == own {
			continue
		}
		var l struct {
			PublicIP    string
			BackendData struct {
				PublicKey string
				Port      int
			}
		}
		if err := json.Unmarshal(kv.Value, &l); err != nil {
			t.Fatalf("lease %s: %v", kv.Key, err)
		}
		sn := strings.ReplaceAll(strings.TrimPrefix(string(kv.Key), Prefix+"/subnets/"), "-", "/")
		out[l.BackendData.PublicKey] = wgPeer{Endpoint: fmt.Sprintf("%s:%d", l.PublicIP, l.BackendData.Port), AllowedIPs: "[" + sn + "]"}
	}
	return out
}

var (
	peerSetRe     = regexp.MustCompile(`msg="peer set" .*key="?([^"\s]+)"? endpoint=(\S+) allowedIPs="?(\[[^\]]*\])`)
	peerRemovedRe = regexp.MustCompile(`msg="peer removed" .*key="?([^"\s]+)`)
)

// loggedPeers replays n's weftd log: the peers of flannel-wg as its last
// weftd configured them (a new weftd starts with a new, empty device).
func loggedPeers(t *testing.T, n *Node) map[string]wgPeer {
	t.Helper()
	log, err := os.ReadFile(n.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	peers := map[string]wgPeer{}
	for _, l := range strings.Split(string(log), "\n") {
		switch {
		case strings.Contains(l, `msg="device ready"`):
			peers = map[string]wgPeer{}
		case strings.Contains(l, `msg="peer set"`):
			m := peerSetRe.FindStringSubmatch(l)
			if m == nil {
				t.Fatalf("%s: cannot read %s", n.Label, l)
			}
			peers[m[1]] = wgPeer{Endpoint: m[2], AllowedIPs: m[3]}
		case strings.Contains(l, `msg="peer removed"`):
			m := peerRemovedRe.FindStringSubmatch(l)
			if m == nil {
				t.Fatalf("%s: cannot read %s", n.Label, l)
			}
			delete(peers, m[1])
		}
	}
	return peers
}

func samePeers(want, got map[string]wgPeer) error {
	if maps.Equal(want, got) {
		return nil
	}
	return fmt.Errorf("configured %v, leases call for %v", got, want)
}
