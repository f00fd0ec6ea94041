package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weft-net/weft/internal/testkit/nettest"
	"github.com/weft-net/weft/subnet"
)

const hostGWConfig = `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"host-gw"}}`

// TestHostGW runs three dual-stack host-gw nodes on one L2 segment, the
// third one being weftd installed as flanneld and configured through
// flanneld's flags and FLANNELD_* variables, and checks Flannel's lease,
// the routes, pod traffic in both families, a node on another segment
// reported instead of routed, and route drift repaired.
func TestHostGW(t *testing.T) {
	c := NewCluster(t, Options{NoConfig: true, UnderlayV6: netip.MustParsePrefix("fd77::/64")})
	c.Put(Prefix+"/config", hostGWConfig)
	flanneld := filepath.Join(c.Dir, "bin", "flanneld")
	if err := os.MkdirAll(filepath.Dir(flanneld), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(c.weftd, flanneld); err != nil {
		t.Fatal(err)
	}
	c.OnNode = func(n *Node) {
		if n.Label == "n3" {
			n.Prog = flanneld
			n.Env = []string{"FLANNELD_IFACE=eth0", "FLANNELD_SUBNET_LEASE_RENEW_MARGIN=60", "FLANNELD_IP_MASQ_FULLY_RANDOM_DISABLE=true"}
		}
	}
	c.AddNode("n1")
	c.AddNode("n2")
	c.AddNode("n3", "--healthz-ip=127.0.0.1", "--healthz-port=9470", "--ip-masq")
	for _, n := range c.Nodes {
		n.WaitReady()
	}
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	if log, _ := os.ReadFile(n3.LogFile); !strings.Contains(string(log), "flannelCompat=true") ||
		!strings.Contains(string(log), "FLANNELD_SUBNET_LEASE_RENEW_MARGIN") {
		t.Errorf("n3 did not run as flanneld with its variables:\n%s", tail(string(log), 30))
	}

	t.Run("lease as Flannel writes it for host-gw", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.Client.Get(ctx, Prefix+"/subnets/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 3 {
			t.Fatalf("%d leases, want 3", len(resp.Kvs))
		}
		for _, kv := range resp.Kvs {
			var v map[string]any
			if err := json.Unmarshal(kv.Value, &v); err != nil {
				t.Fatal(err)
			}
			if v["BackendType"] != "host-gw" || len(v) != 3 || v["PublicIP"] == nil || v["PublicIPv6"] == nil {
				t.Errorf("lease %s = %s, want exactly PublicIP, PublicIPv6 and BackendType host-gw", kv.Key, kv.Value)
			}
		}
	})

	t.Run("FLANNELD_IP_MASQ_FULLY_RANDOM_DISABLE masquerades without fully-random", func(t *testing.T) {
		for _, fam := range []string{"ip weft-ipv4", "ip6 weft-ipv6"} {
			got := Output(t, n3.NS, append([]string{"nft", "list", "chain"}, append(strings.Fields(fam), "postrouting")...)...)
			if strings.Count(got, " masquerade comment ") != 2 || strings.Contains(got, "fully-random") {
				t.Errorf("n3 %s postrouting: want two plain masquerade rules:\n%s", fam, got)
			}
		}
	})

	t.Run("routes via the peers' public addresses", func(t *testing.T) {
		for _, peer := range []*Node{n2, n3} {
			want := peer.Subnet().String() + " via " + peer.Addr.String() + " dev eth0 proto 87"
			if got := Output(t, n1.NS, "ip", "route", "show", peer.Subnet().String()); !strings.HasPrefix(got, want) {
				t.Errorf("n1 route for %s: %q, want %q", peer.Label, got, want)
			}
			got6 := Output(t, n1.NS, "ip", "-6", "route", "show", "proto", "87")
			if !strings.Contains(got6, " via "+ipv6Of(t, peer).String()+" dev eth0") {
				t.Errorf("n1 has no IPv6 route via %s's address:\n%s", peer.Label, got6)
			}
		}
		if mtu := fileMTU(t, n1); mtu != 1500 {
			t.Errorf("FLANNEL_MTU %d, want the underlay's 1500", mtu)
		}
	})

	pods := podsPerNode(t, c, 1)
	t.Run("pods ping across in both families", func(t *testing.T) {
		for i, from := range pods {
			for j, to := range pods {
				if i == j {
					continue
				}
				if err := Ping(from[0].NS, to[0].IP); err != nil {
					t.Errorf("n%d → n%d: %v", i+1, j+1, err)
				}
				// A new pod's IPv6 address is usable once duplicate address
				// detection is over; then every ping must pass.
				Eventually(t, 5*time.Second, fmt.Sprintf("n%d → n%d over IPv6", i+1, j+1), func() error {
					return Ping(from[0].NS, podIPv6(t, to[0]), "-W", "1")
				})
			}
		}
		if err := Ping(pods[0][0].NS, pods[1][0].IP, "-M", "do", "-s", "1472"); err != nil {
			t.Errorf("a full 1500-byte packet must cross host-gw unfragmented: %v", err)
		}
	})

	t.Run("route drift repaired", func(t *testing.T) {
		peer := n2.Subnet().String()
		for _, cmd := range [][]string{
			{"ip", "route", "del", peer},
			{"ip", "route", "replace", peer, "via", n3.Addr.String(), "dev", "eth0"},
		} {
			nettest.MustRun(t, n1, cmd...)
			want := peer + " via " + n2.Addr.String() + " dev eth0 proto 87 \n"
			took := Eventually(t, 5*time.Second, "route back after "+strings.Join(cmd, " "), func() error {
				if got := Output(t, n1.NS, "ip", "route", "show", peer); got != want {
					return fmt.Errorf("route %q, want %q", got, want)
				}
				return nil
			})
			if err := Ping(pods[0][0].NS, pods[1][0].IP); err != nil {
				t.Fatalf("after %v: %v", cmd, err)
			}
			t.Logf("%v repaired in %s", cmd, took.Round(time.Millisecond))
		}
		if v, err := n1.Metric("weft_repairs_total", "kind", "route"); err != nil || v < 2 {
			t.Errorf("weft_repairs_total{kind=route} = %v (%v), want at least 2", v, err)
		}
	})

	t.Run("a node on another segment is reported, not routed", func(t *testing.T) {
		c.OnNode = func(n *Node) {
			nettest.MustRun(t, n, "ip", "addr", "flush", "dev", "eth0", "scope", "global")
			nettest.MustRun(t, n, "ip", "addr", "add", "192.168.88.4/24", "dev", "eth0")
			nettest.MustRun(t, n, "ip", "route", "add", "default", "via", "192.168.88.254", "dev", "eth0", "onlink")
			nettest.MustRun(t, n, "ip", "addr", "add", "fd88::4/64", "dev", "eth0", "nodad")
			nettest.MustRun(t, n, "ip", "-6", "route", "add", "default", "via", "fd88::ffff", "dev", "eth0", "onlink")
		}
		far := c.AddNode("far")
		c.OnNode = nil
		far.WaitReady()
		farSubnet := far.Subnet()
		Eventually(t, 10*time.Second, "n1 reports the far node", func() error {
			v, err := n1.Metric("weft_dataplane_events_total", "event", "peer_off_link")
			if err == nil && v < 1 {
				err = fmt.Errorf("peer_off_link = %v", v)
			}
			return err
		})
		if got := Output(t, n1.NS, "ip", "route", "show", farSubnet.String()); got != "" {
			t.Errorf("n1 routes the off-segment node's subnet: %q", got)
		}
		if got := Output(t, n1.NS, "ip", "-6", "route", "show", "proto", "87"); strings.Contains(got, "fd88::4") {
			t.Errorf("n1 routes via the off-segment node's IPv6 address:\n%s", got)
		}
		log, _ := os.ReadFile(n1.LogFile)
		if !strings.Contains(string(log), "not on this node's L2 segment") || !strings.Contains(string(log), farSubnet.String()) {
			t.Errorf("n1 did not log the off-segment peer %s", farSubnet)
		}
		if err := Ping(pods[0][0].NS, pods[2][0].IP); err != nil {
			t.Errorf("on-segment traffic broken by the far node: %v", err)
		}
		weftctl := nettest.Binary(t, "weftctl")
		out, err := n1.Run(weftctl, "peers", "--etcd-endpoints", c.endpoints)
		if err == nil || !strings.Contains(out, farSubnet.String()) || !strings.Contains(out, "off-link: not on this node's L2 segment") {
			t.Errorf("weftctl peers on n1 must fail and show %s off-link (err %v):\n%s", farSubnet, err, out)
		}
		if strings.Count(out, " ok\n") != 4 {
			t.Errorf("weftctl peers on n1: want the 4 on-segment rows ok:\n%s", out)
		}
		out, err = n1.Run(weftctl, "explain", "--etcd-endpoints", c.endpoints, pods[0][0].IP.String(), farSubnet.Addr().Next().String())
		if err == nil || !strings.Contains(out, "not on this node's L2 segment") {
			t.Errorf("weftctl explain to the far node must report it (err %v):\n%s", err, out)
		}
		out, err = n1.Run(weftctl, "explain", "--etcd-endpoints", c.endpoints, pods[0][0].IP.String(), pods[1][0].IP.String())
		if err != nil || !strings.Contains(out, "via "+n2.Addr.String()+" dev eth0 (host-gw") {
			t.Errorf("weftctl explain n1 → n2 (err %v):\n%s", err, out)
		}
	})
}

// ipv6Of is the node's global IPv6 underlay address.
func ipv6Of(t *testing.T, n *Node) netip.Addr {
	t.Helper()
	for _, f := range strings.Fields(Output(t, n.NS, "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "global")) {
		if p, err := netip.ParsePrefix(f); err == nil {
			return p.Addr()
		}
	}
	t.Fatalf("%s has no global IPv6 address on eth0", n.Label)
	return netip.Addr{}
}

// fileMTU is FLANNEL_MTU from the node's subnet file.
func fileMTU(t *testing.T, n *Node) int {
	t.Helper()
	f, err := subnet.ReadFile(n.SubnetFile)
	if err != nil {
		t.Fatal(err)
	}
	return f.MTU
}
